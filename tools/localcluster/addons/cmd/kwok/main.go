// kwok for the local control plane: fakes the GPU nodes and the lifecycle of pods bound to them.
//
// Without a Stage in its --config files, kwok would run with no stages (nodes never Ready, pods never Running);
// this main then adds the stages kwok itself embeds (fast node init, lease heartbeat, fast pod lifecycle), so a
// --config that only tunes kwok (a KwokConfiguration: its workers, which no flag sets) keeps them.
package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodelease "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/kwok/cmd"
	"sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

// configFiles lists the files of every --config/-c flag (comma-separated lists and repeated flags alike).
func configFiles(args []string) []string {
	var files []string
	for i, a := range args {
		value := ""
		switch {
		case strings.HasPrefix(a, "--config="):
			value = strings.TrimPrefix(a, "--config=")
		case strings.HasPrefix(a, "-c="):
			value = strings.TrimPrefix(a, "-c=")
		case (a == "-c" || a == "--config") && i+1 < len(args):
			value = args[i+1]
		}
		for _, f := range strings.Split(value, ",") {
			if f != "" {
				files = append(files, f)
			}
		}
	}
	return files
}

// stageKind matches a document of kind Stage in a kwok config file.
var stageKind = regexp.MustCompile(`(?m)^kind:\s*Stage\s*$`)

// hasStages says whether any of the files declares a Stage (an unreadable file counts as one: kwok reports it).
func hasStages(files []string) bool {
	return slices.ContainsFunc(files, func(f string) bool {
		data, err := os.ReadFile(f)
		return err != nil || stageKind.Match(data)
	})
}

// jobOwner is how kwok's embedded pod-complete stage picks the pods it finishes: any owner of kind "Job".
const jobOwner = `- key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'`

// podComplete is kwok's embedded pod-complete stage narrowed to pods of batch/v1 Jobs (and CronJobs).
// Upstream matches the owner kind only, which also finishes every pod of a Volcano Job (kind Job in
// batch.volcano.sh) the moment it runs: a training gang would complete instantly and never hold its GPUs.
func podComplete() string {
	narrowed := strings.Replace(podfast.DefaultPodComplete, jobOwner, `- key: '.metadata.ownerReferences.[].apiVersion'
      operator: 'In'
      values:
      - 'batch/v1'`, 1)
	if narrowed == podfast.DefaultPodComplete {
		panic("kwok's pod-complete stage changed: its Job owner selector was not found")
	}
	return narrowed
}

// writeDefaultStages writes kwok's embedded stages to one multi-document file and returns its path.
func writeDefaultStages() (string, error) {
	docs := []string{
		nodefast.DefaultNodeInit,
		nodelease.DefaultNodeHeartbeatWithLease,
		podfast.DefaultPodReady,
		podComplete(),
		podfast.DefaultPodDelete,
	}
	data := []byte(strings.Join(docs, "\n---\n"))
	// One file per content, rewritten in place on every start: nothing accumulates in the temp dir.
	path := filepath.Join(os.TempDir(), fmt.Sprintf("kwok-default-stages-%x.yaml", sha256.Sum256(data)))
	return path, os.WriteFile(path, data, 0o600)
}

func main() {
	if !hasStages(configFiles(os.Args[1:])) {
		path, err := writeDefaultStages()
		if err != nil {
			os.Stderr.WriteString("kwok: writing default stages: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Args = append(os.Args, "--config="+path)
	}

	flags := pflag.NewFlagSet("kwok", pflag.ContinueOnError)
	flags.ParseErrorsAllowlist.UnknownFlags = true
	flags.Usage = func() {}

	ctx, logger := log.InitFlags(signals.SetupSignalContext(), flags)
	ctx, err := config.InitFlags(ctx, flags)
	if err != nil {
		logger.Error("config flags", "err", err)
		os.Exit(1)
	}
	root := cmd.NewCommand(ctx)
	root.PersistentFlags().AddFlagSet(flags)
	if err := root.ExecuteContext(ctx); err != nil {
		logger.Error("kwok exited", "err", err)
		os.Exit(1)
	}
}
