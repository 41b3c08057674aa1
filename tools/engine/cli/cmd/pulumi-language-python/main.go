// Command pulumi-language-python is the project's Python language host for the
// Pulumi engine.
//
// The upstream host is an untagged nested module that the Go module proxy here
// does not serve, so the project carries this small host of its own. It does
// what the engine needs to preview and update a Python program and to run a
// Python policy pack: it runs the program through the SDK's
// `pulumi-language-python-exec` script (copied beside this binary by the build)
// with the interpreter of the project's virtualenv, runs policy packs with
// `python -m pulumi.policy`, and runs Python providers (the project's component
// package in package/) with `python -u <plugin directory>`. Everything else (code generation, packing,
// dependency installation) is left to the ordinary tools and answers
// Unimplemented or does nothing.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sdk "github.com/pulumi/pulumi/sdk/v3"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// execScriptName is the SDK's program launcher; the build copies it beside this binary.
const execScriptName = "pulumi-language-python-exec"

// exitAfterUserMessage is the exit code the Python SDK uses after it has already
// printed an actionable error; the engine must not add a second message.
const exitAfterUserMessage = 32

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	engineAddress string
	tracing       string
	execScript    string

	mu      sync.Mutex
	cancels []context.CancelFunc
}

func main() {
	engineAddress, tracing := parseArgs(os.Args[1:])
	if engineAddress == "" {
		fmt.Fprintln(os.Stderr, "pulumi-language-python: missing the engine address argument")
		os.Exit(2)
	}
	script, err := findExecScript()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: %v\n", err)
		os.Exit(2)
	}
	h := &host{engineAddress: engineAddress, tracing: tracing, execScript: script}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, h)
			return nil
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: could not start the gRPC server: %v\n", err)
		os.Exit(1)
	}
	// The engine reads the port from the first line of stdout.
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: %v\n", err)
		os.Exit(1)
	}
}

// parseArgs takes the engine address (the last positional argument) and the
// tracing endpoint; other flags the engine may pass are accepted and ignored so
// that a newer engine does not break the host.
func parseArgs(args []string) (engineAddress, tracing string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			engineAddress = a
			continue
		}
		name := strings.TrimLeft(a, "-")
		value := ""
		if k, v, ok := strings.Cut(name, "="); ok {
			name, value = k, v
		} else if name == "tracing" && i+1 < len(args) {
			i++
			value = args[i]
		}
		if name == "tracing" {
			tracing = value
		}
	}
	return engineAddress, tracing
}

func findExecScript() (string, error) {
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		candidate := filepath.Join(filepath.Dir(exe), execScriptName)
		if _, err := os.Stat(candidate); err == nil {
			return candidate, nil
		}
	}
	if p, err := exec.LookPath(execScriptName); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found beside the language host nor on PATH", execScriptName)
}

// resolveToolchain picks the interpreter: the `virtualenv` runtime option of
// Pulumi.yaml (relative to the project root), else python on PATH.
func resolveToolchain(info *pulumirpc.ProgramInfo) (toolchain.Toolchain, error) {
	opts := toolchain.PythonOptions{
		Root:       info.GetRootDirectory(),
		ProgramDir: info.GetProgramDirectory(),
		Toolchain:  toolchain.Pip,
	}
	if o := info.GetOptions(); o != nil {
		m := o.AsMap()
		if tc, ok := m["toolchain"].(string); ok && tc != "" && tc != "pip" {
			return nil, fmt.Errorf("runtime option toolchain=%q is not supported by this language host (use pip)", tc)
		}
		if venv, ok := m["virtualenv"].(string); ok && venv != "" {
			if !filepath.IsAbs(venv) {
				venv = filepath.Join(opts.Root, venv)
			}
			opts.Virtualenv = venv
		}
	}
	return toolchain.ResolveToolchain(opts)
}

func (h *host) track(cancel context.CancelFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cancels = append(h.cancels, cancel)
}

func (h *host) Handshake(
	_ context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	if req.GetEngineAddress() != "" {
		h.engineAddress = req.GetEngineAddress()
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

// GetRequiredPackages reports nothing: the engine then loads each provider when
// the program first registers a resource of it, from the installed plugins.
func (h *host) GetRequiredPackages(
	context.Context, *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	return &pulumirpc.GetRequiredPackagesResponse{}, nil
}

func (h *host) GetRequiredPlugins(
	context.Context, *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	return &pulumirpc.GetRequiredPluginsResponse{}, nil
}

func (h *host) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version.Version}, nil
}

func (h *host) GetProgramDependencies(
	context.Context, *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	return &pulumirpc.GetProgramDependenciesResponse{}, nil
}

func (h *host) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	tc, err := resolveToolchain(req.GetInfo())
	if err != nil {
		return nil, err
	}
	about, err := tc.About(ctx)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.AboutResponse{Executable: about.PythonExecutable, Version: about.PythonVersion.String()}, nil
}

// InstallDependencies does nothing: `make venv` owns the project's virtualenv.
func (h *host) InstallDependencies(
	*pulumirpc.InstallDependenciesRequest, grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse],
) error {
	return nil
}

func (h *host) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.cancels {
		c()
	}
	return &emptypb.Empty{}, nil
}

// runArguments are the flags the SDK's launcher script understands.
func (h *host) runArguments(req *pulumirpc.RunRequest) []string {
	args := []string{h.execScript}
	add := func(k, v string) {
		if v != "" {
			args = append(args, "--"+k, v)
		}
	}
	add("monitor", req.GetMonitorAddress())
	add("engine", h.engineAddress)
	add("project", req.GetProject())
	add("root_directory", req.GetInfo().GetRootDirectory())
	add("stack", req.GetStack())
	add("pwd", req.GetPwd())
	add("dry_run", strconv.FormatBool(req.GetDryRun()))
	add("parallel", strconv.Itoa(int(req.GetParallel())))
	add("tracing", h.tracing)
	add("organization", req.GetOrganization())
	args = append(args, req.GetInfo().GetEntryPoint())
	return append(args, req.GetArgs()...)
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	tc, err := resolveToolchain(req.GetInfo())
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	h.track(cancel)

	cmd, err := tc.Command(runCtx, append([]string{"-u"}, h.runArguments(req)...)...)
	if err != nil {
		return nil, err
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	config, err := json.Marshal(req.GetConfig())
	if err != nil {
		return nil, fmt.Errorf("serializing the stack configuration: %w", err)
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	secretJSON, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, fmt.Errorf("serializing the secret configuration keys: %w", err)
	}
	cmd.Env = append(env, "PULUMI_CONFIG="+string(config), "PULUMI_CONFIG_SECRET_KEYS="+string(secretJSON))

	if err := cmd.Run(); err != nil {
		_ = os.Stdout.Sync()
		_ = os.Stderr.Sync()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.ExitStatus() == exitAfterUserMessage {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("program exited with non-zero exit code: %d",
				exitErr.ExitCode())}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("could not run the Python program: %v", err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// RunPlugin runs Python policy packs (analyzer plugins) and Python resource
// providers such as component packages (a directory with PulumiPlugin.yaml and
// __main__.py); the engine talks to a pack through the SDK's policy proxy, which
// also hands over the stack config.
func (h *host) RunPlugin(
	req *pulumirpc.RunPluginRequest, server grpc.ServerStreamingServer[pulumirpc.RunPluginResponse],
) error {
	ctx := server.Context()
	switch req.GetKind() {
	case "analyzer":
	case "resource":
		return h.runResourcePlugin(req, server)
	default:
		return fmt.Errorf("this language host runs policy packs and resource providers, not %q plugins", req.GetKind())
	}
	tc, err := resolveToolchain(req.GetInfo())
	if err != nil {
		return err
	}
	args := append([]string{"-u", "-m", "pulumi.policy"}, req.GetArgs()...)
	args = append(args, req.GetInfo().GetProgramDirectory())
	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return err
	}
	cmd.Dir = req.GetInfo().GetProgramDirectory()

	closer, stdout, stderr, err := rpcutil.MakeRunPluginStreams(server, false)
	if err != nil {
		return err
	}
	defer closer.Close()

	proxy, stdout, err := sdk.NewPolicyProxy(ctx, stdout)
	if err != nil {
		return fmt.Errorf("could not start the policy pack proxy: %w", err)
	}
	conf, err := proxy.AwaitConfiguration(ctx)
	if err != nil {
		return fmt.Errorf("could not get the stack configuration for the policy pack: %w", err)
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	if conf != nil {
		set := func(k, v string) {
			if v != "" {
				env = append(env, k+"="+v)
			}
		}
		set("PULUMI_ORGANIZATION", conf.GetOrganization())
		set("PULUMI_PROJECT", conf.GetProject())
		set("PULUMI_STACK", conf.GetStack())
		set("PULUMI_DRY_RUN", strconv.FormatBool(conf.GetDryRun()))
		if conf.GetConfig() != nil {
			b, err := json.Marshal(conf.GetConfig())
			if err != nil {
				return fmt.Errorf("serializing the stack configuration: %w", err)
			}
			set("PULUMI_CONFIG", string(b))
		}
	}
	cmd.Env = append(env, req.GetEnv()...)
	cmd.Stdout, cmd.Stderr = stdout, stderr

	code := int32(0)
	err = cmd.Start()
	if err == nil {
		// The proxy reads the pack's port from its stdout, forwards the stack configuration,
		// and returns when the pack exits.
		err = proxy.Attach(ctx, cmd)
	}
	if err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			return fmt.Errorf("could not run the policy pack: %w", err)
		}
		code = int32(exitErr.ExitCode())
	}
	return server.Send(&pulumirpc.RunPluginResponse{
		Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: code},
	})
}

// runResourcePlugin runs a Python provider: the plugin directory's __main__.py with
// the engine's arguments (engine address first). The provider prints its port on
// stdout, which is streamed back to the engine as the plugin's output.
func (h *host) runResourcePlugin(
	req *pulumirpc.RunPluginRequest, server grpc.ServerStreamingServer[pulumirpc.RunPluginResponse],
) error {
	ctx := server.Context()
	tc, err := resolveToolchain(req.GetInfo())
	if err != nil {
		return err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return err
	}
	args := append([]string{"-u", req.GetInfo().GetProgramDirectory()}, req.GetArgs()...)
	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return err
	}
	cmd.Dir = req.GetPwd()
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(env, req.GetEnv()...)

	closer, stdout, stderr, err := rpcutil.MakeRunPluginStreams(server, false)
	if err != nil {
		return err
	}
	defer closer.Close()
	cmd.Stdout, cmd.Stderr = stdout, stderr

	code := int32(0)
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			return fmt.Errorf("could not run the provider plugin: %w", err)
		}
		code = int32(exitErr.ExitCode())
	}
	return server.Send(&pulumirpc.RunPluginResponse{
		Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: code},
	})
}
