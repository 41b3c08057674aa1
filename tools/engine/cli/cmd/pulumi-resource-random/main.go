// Command pulumi-resource-random is the project's stand-in for the random provider.
//
// The project draws a few integers with pulumi_random (the weekly checkpoint-check schedule), and
// the Go module proxy here does not serve the upstream provider, so the real engine could not
// preview a stack that uses it. This provider implements the one resource the project uses,
// random:index/randomInteger:RandomInteger, with the upstream contract: inputs min, max, seed and
// keepers; output result; any input change replaces the resource; the result is stored in state and
// never changes afterwards. A seeded draw is deterministic (SHA-256 of the seed), but not the same
// number the upstream provider would draw for that seed. Any other resource type is refused by name.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/big"
	"reflect"
	"strconv"

	"github.com/pulumi/pulumi/pkg/v3/resource/provider"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/cmdutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Version is set by -ldflags at build time.
var Version = "0.0.0-dev"

const randomIntegerType = "random:index/randomInteger:RandomInteger"

// inputKeys are the RandomInteger inputs; a change to any of them replaces the resource.
var inputKeys = []string{"min", "max", "seed", "keepers"}

type randomProvider struct {
	pulumirpc.UnimplementedResourceProviderServer
}

func main() {
	err := provider.Main("random", func(*provider.HostClient) (pulumirpc.ResourceProviderServer, error) {
		return &randomProvider{}, nil
	})
	if err != nil {
		cmdutil.ExitError(err.Error())
	}
}

func resourceType(urn string) string {
	// urn:pulumi:stack::project::qualified$type::name; the type is the last '$' part of field 3.
	parts := splitURN(urn)
	if len(parts) < 4 {
		return ""
	}
	t := parts[2]
	for i := len(t) - 1; i >= 0; i-- {
		if t[i] == '$' {
			return t[i+1:]
		}
	}
	return t
}

func splitURN(urn string) []string {
	var out []string
	start := 0
	for i := 0; i+1 < len(urn); i++ {
		if urn[i] == ':' && urn[i+1] == ':' {
			out = append(out, urn[start:i])
			start = i + 2
			i++
		}
	}
	return append(out, urn[start:])
}

func checkType(urn string) error {
	if t := resourceType(urn); t != randomIntegerType {
		return fmt.Errorf("resource type %q is not supported by the project's random provider (only %s)",
			t, randomIntegerType)
	}
	return nil
}

func (p *randomProvider) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: Version}, nil
}

func (p *randomProvider) Handshake(
	context.Context, *pulumirpc.ProviderHandshakeRequest,
) (*pulumirpc.ProviderHandshakeResponse, error) {
	return &pulumirpc.ProviderHandshakeResponse{AcceptSecrets: true, AcceptResources: true}, nil
}

func (p *randomProvider) CheckConfig(
	_ context.Context, req *pulumirpc.CheckRequest,
) (*pulumirpc.CheckResponse, error) {
	return &pulumirpc.CheckResponse{Inputs: req.GetNews()}, nil
}

func (p *randomProvider) DiffConfig(context.Context, *pulumirpc.DiffRequest) (*pulumirpc.DiffResponse, error) {
	return &pulumirpc.DiffResponse{Changes: pulumirpc.DiffResponse_DIFF_NONE}, nil
}

func (p *randomProvider) Configure(
	context.Context, *pulumirpc.ConfigureRequest,
) (*pulumirpc.ConfigureResponse, error) {
	return &pulumirpc.ConfigureResponse{AcceptSecrets: true, SupportsPreview: true, AcceptResources: true}, nil
}

func number(m map[string]any, key string) (int64, bool, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return 0, false, nil
	}
	f, ok := v.(float64)
	if !ok {
		// An unknown value during preview arrives as a string sentinel.
		return 0, false, nil
	}
	if f != float64(int64(f)) {
		return 0, false, fmt.Errorf("%s must be a whole number, got %v", key, f)
	}
	return int64(f), true, nil
}

func (p *randomProvider) Check(_ context.Context, req *pulumirpc.CheckRequest) (*pulumirpc.CheckResponse, error) {
	if err := checkType(req.GetUrn()); err != nil {
		return nil, err
	}
	news := req.GetNews().AsMap()
	var failures []*pulumirpc.CheckFailure
	lo, haveLo, err := number(news, "min")
	if err != nil {
		failures = append(failures, &pulumirpc.CheckFailure{Property: "min", Reason: err.Error()})
	}
	hi, haveHi, err := number(news, "max")
	if err != nil {
		failures = append(failures, &pulumirpc.CheckFailure{Property: "max", Reason: err.Error()})
	}
	if _, ok := news["min"]; !ok {
		failures = append(failures, &pulumirpc.CheckFailure{Property: "min", Reason: "min is required"})
	}
	if _, ok := news["max"]; !ok {
		failures = append(failures, &pulumirpc.CheckFailure{Property: "max", Reason: "max is required"})
	}
	if haveLo && haveHi && lo > hi {
		failures = append(failures, &pulumirpc.CheckFailure{
			Property: "max", Reason: fmt.Sprintf("max (%d) must not be below min (%d)", hi, lo),
		})
	}
	return &pulumirpc.CheckResponse{Inputs: req.GetNews(), Failures: failures}, nil
}

func (p *randomProvider) Diff(_ context.Context, req *pulumirpc.DiffRequest) (*pulumirpc.DiffResponse, error) {
	if err := checkType(req.GetUrn()); err != nil {
		return nil, err
	}
	olds, news := req.GetOlds().AsMap(), req.GetNews().AsMap()
	var replaces []string
	for _, k := range inputKeys {
		if !reflect.DeepEqual(olds[k], news[k]) {
			replaces = append(replaces, k)
		}
	}
	if len(replaces) == 0 {
		return &pulumirpc.DiffResponse{Changes: pulumirpc.DiffResponse_DIFF_NONE}, nil
	}
	return &pulumirpc.DiffResponse{
		Changes: pulumirpc.DiffResponse_DIFF_SOME, Replaces: replaces, Diffs: replaces,
	}, nil
}

// draw picks an integer in [lo, hi]: from the seed when one is given, else from crypto/rand.
func draw(lo, hi int64, seed string) (int64, error) {
	span := uint64(hi-lo) + 1
	if seed != "" {
		sum := sha256.Sum256([]byte(seed))
		return lo + int64(binary.BigEndian.Uint64(sum[:8])%span), nil
	}
	n, err := rand.Int(rand.Reader, new(big.Int).SetUint64(span))
	if err != nil {
		return 0, err
	}
	return lo + n.Int64(), nil
}

func (p *randomProvider) Create(
	_ context.Context, req *pulumirpc.CreateRequest,
) (*pulumirpc.CreateResponse, error) {
	if err := checkType(req.GetUrn()); err != nil {
		return nil, err
	}
	props := req.GetProperties().AsMap()
	if req.GetPreview() {
		// The result stays unknown in a preview.
		return &pulumirpc.CreateResponse{Properties: req.GetProperties()}, nil
	}
	lo, _, err := number(props, "min")
	if err != nil {
		return nil, err
	}
	hi, _, err := number(props, "max")
	if err != nil {
		return nil, err
	}
	seed, _ := props["seed"].(string)
	result, err := draw(lo, hi, seed)
	if err != nil {
		return nil, err
	}
	props["result"] = float64(result)
	out, err := structpb.NewStruct(props)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.CreateResponse{Id: strconv.FormatInt(result, 10), Properties: out}, nil
}

func (p *randomProvider) Read(_ context.Context, req *pulumirpc.ReadRequest) (*pulumirpc.ReadResponse, error) {
	if err := checkType(req.GetUrn()); err != nil {
		return nil, err
	}
	return &pulumirpc.ReadResponse{Id: req.GetId(), Properties: req.GetProperties(), Inputs: req.GetInputs()}, nil
}

func (p *randomProvider) Update(context.Context, *pulumirpc.UpdateRequest) (*pulumirpc.UpdateResponse, error) {
	return nil, fmt.Errorf("RandomInteger is never updated in place: every input change replaces it")
}

func (p *randomProvider) Delete(_ context.Context, req *pulumirpc.DeleteRequest) (*emptypb.Empty, error) {
	if err := checkType(req.GetUrn()); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}
