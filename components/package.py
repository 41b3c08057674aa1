"""The cluster as a Pulumi component package: ``UnifiedGpuCluster`` for TypeScript, Go, YAML and other programs.

``package/`` hosts this module's :class:`UnifiedGpuCluster` with the Python SDK's component provider host,
which infers the package schema from the type annotations of the component's ``args``. The args type is
generated here from :class:`~components.config.ClusterConfig`, so the schema and the stack file share one
source of truth: every key of ``Pulumi.<stack>.yaml`` under ``gpu-cluster:`` is an input of the same name,
nested sections become named object types, and the component validates what it gets with the stack's own
rules (:func:`components.stack.validate_config`), so a bad value gets the same message from either door.

The schema inference understands only primitives, optional values, lists, string-keyed maps, enums and
nested annotated classes. Where the config model says more, the schema says less and validation says the
rest: a ``Literal`` is a string, a tagged union (``backend: nfs``, ``kind: liqo``) is one object type with
every member's keys, constrained values are their base type. Integers are schema numbers: the SDK's own
conversion would truncate ``8.5`` to ``8`` silently, while the config model refuses it by name.

This module must not use ``from __future__ import annotations``: the analyzer reads ``__init__``'s
annotations as objects, not strings.
"""

import enum
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Required, TypedDict, Union, get_args, get_origin

import pulumi
from pydantic import BaseModel

import components.config as config_package
from components import cluster
from components.config import PROJECT, ClusterConfig, ConfigError
from components.stack import StackConfigError, engine_config, validate_config

#: The package's name: the schema's, the plugin's and the type token's first part.
PACKAGE = PROJECT
COMPONENT = "UnifiedGpuCluster"
ARGS_TYPE_NAME = f"{COMPONENT}Args"


class SchemaTypeError(TypeError):
    """The config model uses a type the package schema cannot express (or two types share a name)."""


def _strip(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` metadata and without ``None`` in an optional union."""
    while get_origin(annotation) is typing.Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _strip(members[0])
    return annotation


def _union_name(annotation: Any, models: list[type[BaseModel]]) -> str:
    """The name the config package exports for a tagged union (``Filesystem``), else its members' common base."""
    for name, value in vars(config_package).items():
        if not name.startswith("_") and get_origin(value) is typing.Annotated and _strip(value) == annotation:
            return name
    common = next(c for c in models[0].__mro__ if all(c in m.__mro__ for m in models))
    return common.__name__.removesuffix("Base")


def _union_key(models: list[type[BaseModel]]) -> str:
    """The key whose value picks the member (``backend``, ``kind``)."""
    for tagged in config_package.TAGGED_UNIONS:
        if set(tagged.members.values()) == set(models):
            return tagged.key
    raise SchemaTypeError(f"union of {[m.__name__ for m in models]} is not a registered tagged union")


class _Builder:
    """Builds one TypedDict per config model, named after it; the analyzer turns each into a schema type."""

    def __init__(self) -> None:
        self.types: dict[str, Any] = {}
        self.sources: dict[str, object] = {}

    def _claim(self, name: str, source: object) -> bool:
        """True when ``name`` is new; False when ``source`` already has it; an error when another has."""
        known = self.sources.get(name)
        if known is None:
            self.sources[name] = source
            return True
        if known == source:
            return False
        raise SchemaTypeError(f"two config types are both named {name!r} ({known!r} and {source!r}); "
                              "the package schema puts every type in one namespace, so rename one")

    def typed_dict(self, name: str, fields: Mapping[str, tuple[Any, bool]], doc: str | None, source: object) -> Any:
        """A ``total=False`` TypedDict with ``Required`` keys; reused when ``source`` was built before."""
        if not self._claim(name, source):
            return self.types[name]
        annotations = {key: Required[hint] if required else hint for key, (hint, required) in fields.items()}
        # Built at run time from the model (mypy checks only literal TypedDicts; the tests check these).
        built: Any = TypedDict(name, annotations, total=False)  # type: ignore[misc]
        built.__module__ = __name__
        built.__doc__ = doc
        self.types[name] = built
        return built

    def model(self, model: type[BaseModel], name: str | None = None) -> Any:
        fields = {
            field.alias or key: (self.hint(field.annotation, f"{model.__name__}.{key}"), field.is_required())
            for key, field in model.model_fields.items()
        }
        return self.typed_dict(name or model.__name__, fields, _summary(model.__doc__), model)

    def tagged_union(self, annotation: Any, models: list[type[BaseModel]]) -> Any:
        """One object type with every member's keys; a key is required only where every member requires it."""
        fields: dict[str, tuple[Any, bool]] = {}
        for model in models:
            for key, field in model.model_fields.items():
                alias = field.alias or key
                hint = self.hint(field.annotation, f"{model.__name__}.{key}")
                required = field.is_required()
                if alias in fields:
                    known, known_required = fields[alias]
                    hint = known if known == hint else Any
                    required = required and known_required
                fields[alias] = (hint, required)
        for alias, (hint, _) in fields.items():
            present_in_all = all(any((f.alias or k) == alias for k, f in m.model_fields.items()) for m in models)
            fields[alias] = (hint, fields[alias][1] and present_in_all)
        name = _union_name(annotation, models)
        key = _union_key(models)
        tags = ", ".join(f"'{get_args(m.model_fields[_field_name(m, key)].annotation)[0]}'" for m in models)
        doc = f"Its '{key}' ({tags}) decides which of the other keys apply."
        return self.typed_dict(name, fields, doc, annotation)

    def hint(self, annotation: Any, where: str) -> Any:
        """The schema-inferable annotation for one config field's annotation."""
        annotation = _strip(annotation)
        origin = get_origin(annotation)
        if annotation is bool or annotation is str or annotation is float:
            return annotation
        if annotation is int:
            return float
        if annotation is Any:
            return Any
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            return annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return self.model(annotation)
        if origin is Literal:
            kinds = {type(v) for v in get_args(annotation)}
            if kinds == {str}:
                return str
            raise SchemaTypeError(f"{where}: only string literals are supported, got {annotation!r}")
        if origin is list:
            (item,) = get_args(annotation)
            return list[self.hint(item, where)]  # type: ignore[misc]
        if origin is dict:
            key, value = get_args(annotation)
            if _strip(key) is not str:
                raise SchemaTypeError(f"{where}: map keys must be strings, got {key!r}")
            return dict[str, self.hint(value, where)]  # type: ignore[misc]
        if origin in (Union, types.UnionType):
            members = [_strip(m) for m in get_args(annotation)]
            if all(isinstance(m, type) and issubclass(m, BaseModel) for m in members):
                return self.tagged_union(annotation, members)
        raise SchemaTypeError(f"{where}: the package schema cannot express {annotation!r}")


def _field_name(model: type[BaseModel], alias: str) -> str:
    return next(k for k, f in model.model_fields.items() if (f.alias or k) == alias)


def _summary(doc: str | None) -> str | None:
    """A docstring's first paragraph on one line (the schema's description)."""
    if not doc:
        return None
    return " ".join(doc.strip().split("\n\n")[0].split())


def build_args_types(model: type[BaseModel] = ClusterConfig, name: str = ARGS_TYPE_NAME) -> tuple[Any, dict[str, Any]]:
    """The component's args TypedDict for ``model`` and the nested object types it uses, by name."""
    builder = _Builder()
    args = builder.model(model, name)
    return args, {k: v for k, v in builder.types.items() if k != name}


if TYPE_CHECKING:
    UnifiedGpuClusterArgs = dict[str, Any]
else:
    UnifiedGpuClusterArgs = build_args_types()[0]


def config_from_args(args: Mapping[str, Any], name: str) -> ClusterConfig:
    """Validate the component's args with the stack's rules; credentials are read from the caller's stack config.

    A provider's credentials are named by ``credentialsSecret`` and must be set as secrets under the
    ``gpu-cluster:`` namespace in the calling program's stack (``pulumi config set --secret
    gpu-cluster:<key> …``), exactly as for this project's own stacks.
    """
    values, secret_keys = engine_config()
    prefix = f"{PROJECT}:"
    present = {k.removeprefix(prefix) for k in values if k.startswith(prefix)}
    secret_names = {k.removeprefix(prefix) for k in secret_keys if k.startswith(prefix)}
    raw = {k: v for k, v in args.items() if v is not None}
    return validate_config(raw, secret_names, present, f"the args of {COMPONENT} {name!r}")


class UnifiedGpuCluster(cluster.UnifiedGpuCluster):
    """Training and inference sharing on-prem GPUs; its inputs are the keys of a gpu-cluster stack file."""

    # The inputs are the keys under ``gpu-cluster:`` of a ``Pulumi.<stack>.yaml`` of this project, checked by
    # the same rules (docs/configuration.md); the docstring above is the schema's description.

    onprem_gpus: pulumi.Output[int]
    """GPUs in the on-prem pools."""
    scheduler_name: pulumi.Output[str]
    """The scheduler name training pods use (schedulerName)."""
    priority_classes: pulumi.Output[dict[str, str]]
    """PriorityClass name of each tier (system, training, inference, default)."""

    def __init__(self, name: str, args: UnifiedGpuClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        try:
            config = config_from_args(args, name)
        except ConfigError as error:  # the engine shows a RunError's message alone, without our stack trace
            raise StackConfigError.of(error) from None
        super().__init__(name, config, opts)
        self.scheduler_name = self.scheduler.scheduler_name
        self.priority_classes = pulumi.Output.from_input({t.value: n for t, n in self.priorities.names.items()})
