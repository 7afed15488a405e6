package cli

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

func (a *App) applyCommand() *cobra.Command {
	var (
		files    []string
		owner    string
		prune    bool
		nodeName string
		cmd      *cobra.Command
	)
	cmd = &cobra.Command{
		Use:   "apply -f FILE [-f FILE...]",
		Short: "Create or replace the services in files",
		Long: `Create or replace the services in files ("-" is standard input).

A file is YAML or JSON and holds one service, a list of services, or
{services: [...]}; YAML files may hold several documents separated by "---".
A service is vipd.v1.Service in its JSON form, for example:

  name: default/web
  vips: [10.96.0.10]
  ports:
  - {name: http, protocol: tcp, port: 80, target_port: 8080}
  backends:
  - {ip: 10.0.1.5}
  - {ip: 10.0.2.7, state: terminating}
  session_affinity: {mode: client_ip}

Field names may be written as in the .proto (target_port) or in lowerCamel
(targetPort). Enums take their full names (PROTOCOL_UDP) or short ones:
protocol tcp, udp, sctp; state ready, terminating, not-serving; session
affinity mode none, client_ip; internal_traffic_policy cluster, local;
load_balancing random, maglev. Unknown fields are errors. The output of
"vipctl service get -o yaml" and "vipctl service list -o json" reads back.

Files may also hold Kubernetes Services (v1) and EndpointSlices
(discovery.k8s.io/v1), alone or in a List, as "kubectl get
svc,endpointslices -A -o yaml" prints them, and mixed with vipd services.
They are converted as vipd's Kubernetes adapter converts them: the service
namespace/name with the Service's cluster IPs and ports, and as backends the
endpoints of its EndpointSlices (in any of the files), each with the port
numbers its slice gives, and no owner (--owner gives one). Unknown fields
are errors; a missing namespace is "default". --node-name names this node,
whose endpoints are node-local (internalTrafficPolicy: Local). What
kube-proxy would not program either (headless and ExternalName Services,
Services with the label service.kubernetes.io/service-proxy-name) and
EndpointSlices of no Service in the files are left out, with a note on
standard error.

Without --prune, each service is upserted in turn, and apply stops at the
first error; the services before it stay applied. --owner fills in an empty
owner, and a service with another owner is an error.

With --prune (which needs --owner), one atomic call makes the owner's
services exactly those in the files, deleting the owner's other services;
other owners' services are never touched.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(ctx context.Context, _ []string) error {
			if prune && owner == "" {
				return usageErrorf("--prune needs --owner, whose services not in the files it deletes")
			}
			if !cmd.Flags().Changed("node-name") {
				nodeName = defaultNodeName()
			}
			svcs, err := a.loadServicesFor(manifest.Options{NodeName: nodeName}, files, owner)
			if err != nil {
				return err
			}
			return a.withClient(func(c *client.Client) error {
				if prune {
					return a.sync(ctx, c, owner, svcs)
				}
				return a.upsertAll(ctx, c, svcs)
			})
		}),
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `file of services, "-" for standard input; repeatable`)
	cmd.Flags().StringVar(&owner, "owner", "", "owner of the services")
	cmd.Flags().BoolVar(&prune, "prune", false, "also delete the owner's services that the files do not list")
	cmd.Flags().StringVar(&nodeName, "node-name", "", "Kubernetes files: this node's name; endpoints with this nodeName are node-local "+
		"(default $"+NodeNameEnv+", else the host name in lower case)")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}

// loadServices is loadServicesFor with no node name: no Kubernetes
// endpoint is node-local.
func (a *App) loadServices(files []string, owner string) ([]*vipdv1.Service, error) {
	return a.loadServicesFor(manifest.Options{}, files, owner)
}

// loadServicesFor reads the services of files with opts, in order
// (Kubernetes objects, converted once all files are read, come after the
// vipd services), prints the loader's notes on what it left out to the
// error stream, and prepares the services for vipd: owner fills in an
// empty owner, and the output-only generation (present in what "service
// get -o yaml" prints) is cleared.
func (a *App) loadServicesFor(opts manifest.Options, files []string, owner string) ([]*vipdv1.Service, error) {
	l := manifest.NewLoader(opts)
	for _, f := range files {
		var err error
		if f == "-" {
			err = l.Read(a.streams.In, manifest.Stdin)
		} else {
			err = l.ReadFile(f)
		}
		if err != nil {
			return nil, err
		}
	}
	res, err := l.Result()
	if err != nil {
		return nil, err
	}
	for _, note := range res.Notes {
		fmt.Fprintf(a.streams.Err, "note: %s\n", note)
	}
	all := res.Services
	seen := map[string]bool{}
	for _, s := range all {
		if seen[s.GetName()] {
			return nil, inputErrorf("service %q appears more than once in the files", s.GetName())
		}
		seen[s.GetName()] = true
		s.Generation = 0
		switch {
		case owner == "":
		case s.GetOwner() == "":
			s.Owner = owner
		case s.GetOwner() != owner:
			return nil, inputErrorf("service %q has owner %q, not --owner %q", s.GetName(), s.GetOwner(), owner)
		}
	}
	return all, nil
}

// upsertAll upserts svcs one by one, reporting each as it goes in table
// mode, and stops at the first error.
func (a *App) upsertAll(ctx context.Context, c *client.Client, svcs []*vipdv1.Service) error {
	p := a.printer()
	var stored []*vipdv1.Service
	for _, s := range svcs {
		got, err := c.UpsertService(ctx, s, 0)
		if err != nil {
			return fmt.Errorf("apply service %s: %w", s.GetName(), err)
		}
		stored = append(stored, got)
		if p.format == outputTable {
			fmt.Fprintf(p.w, "service/%s configured (generation %d)\n", got.GetName(), got.GetGeneration())
		}
	}
	if p.format == outputTable {
		return nil
	}
	return p.show(&vipdv1.ListServicesResponse{Services: stored}, nil)
}

// sync makes owner's services exactly svcs and reports what changed.
func (a *App) sync(ctx context.Context, c *client.Client, owner string, svcs []*vipdv1.Service) error {
	resp, err := c.SyncServices(ctx, owner, svcs)
	if err != nil {
		return fmt.Errorf("sync services of owner %s: %w", owner, err)
	}
	return a.printer().show(resp, func(t *table) {
		classes := []struct {
			verb  string
			names []string
		}{
			{"created", resp.GetCreated()},
			{"updated", resp.GetUpdated()},
			{"deleted", resp.GetDeleted()},
			{"unchanged", resp.GetUnchanged()},
		}
		for _, class := range classes {
			for _, name := range class.names {
				t.row(fmt.Sprintf("service/%s %s", name, class.verb))
			}
		}
		t.row(fmt.Sprintf("owner %s: %d created, %d updated, %d deleted, %d unchanged", owner,
			len(resp.GetCreated()), len(resp.GetUpdated()), len(resp.GetDeleted()), len(resp.GetUnchanged())))
	})
}

// NodeNameEnv names the environment variable that gives apply's --node-name
// its default, as the Kubernetes downward API sets it in a pod.
const NodeNameEnv = "NODE_NAME"

// defaultNodeName is NodeNameEnv, else the host name in lower case, which
// is how the kubelet names its node; "" if neither is known.
func defaultNodeName() string {
	if v := os.Getenv(NodeNameEnv); v != "" {
		return v
	}
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return strings.ToLower(strings.TrimSpace(h))
}
