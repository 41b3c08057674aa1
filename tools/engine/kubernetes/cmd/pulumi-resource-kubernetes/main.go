// Command pulumi-resource-kubernetes is the project's build of the Kubernetes
// resource provider.
//
// The provider's own main embeds files its repository generates and does not
// commit, so they are missing from the module. This main embeds the provider's
// committed schema and Terraform mapping instead; tools/engine/build.sh copies
// them from the module cache into build/ (git-ignored) and stamps the version
// into the schema, and sets the version below by -ldflags.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed build/schema.json
var schema []byte

//go:embed build/terraform-mapping.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, schema, terraformMapping)
}
