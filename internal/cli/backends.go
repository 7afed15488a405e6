package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func (a *App) backendsCommand() *cobra.Command {
	return a.group(&cobra.Command{
		Use:     "backends",
		Aliases: []string{"backend", "be"},
		Short:   "Add, remove and list the backends of a service",
	},
		a.backendsAddCommand(),
		a.backendsRemoveCommand(),
		a.backendsListCommand(),
	)
}

func (a *App) backendsAddCommand() *cobra.Command {
	var (
		weight     uint32
		state      string
		nodeLocal  bool
		zone       string
		ports      []string
		generation uint64
		dryRun     bool
	)
	cmd := &cobra.Command{
		Use:   "add SERVICE IP [IP...]",
		Short: "Add backends to a service, or replace those with the same IPs",
		Long: `Add backends to a service, or replace those with the same IPs. Every IP
gets the same settings from the flags. The other backends stay as they are.`,
		Args: cobra.MinimumNArgs(2),
		RunE: a.run(func(ctx context.Context, args []string) error {
			var st vipdv1.BackendState
			if state != "" {
				n, err := manifest.ParseEnum(st.Descriptor(), state)
				if err != nil {
					return usageErrorf("--state: %w", err)
				}
				st = vipdv1.BackendState(n)
			}
			portMap, err := parsePorts(ports)
			if err != nil {
				return err
			}
			var backends []*vipdv1.Backend
			for _, ip := range args[1:] {
				backends = append(backends, &vipdv1.Backend{
					Ip: ip, Ports: maps.Clone(portMap), State: st, Weight: weight, NodeLocal: nodeLocal, Zone: zone,
				})
			}
			return a.updateBackends(ctx, &vipdv1.UpdateBackendsRequest{
				Name: args[0], Upsert: backends, ExpectedGeneration: generation, ValidateOnly: dryRun,
			})
		}),
	}
	f := cmd.Flags()
	f.Uint32Var(&weight, "weight", 0, "weight, 1-65535 (0: 1)")
	f.StringVar(&state, "state", "", "state: "+strings.Join(manifest.ShortEnumNames(vipdv1.BackendState(0).Descriptor()), ", ")+" (default ready)")
	f.BoolVar(&nodeLocal, "node-local", false, "the backends run on this node")
	f.StringVar(&zone, "zone", "", "topology zone of the backends")
	f.StringArrayVar(&ports, "port", nil, `NAME=PORT: the backends' target port for the service port NAME (=PORT for the service's unnamed port); repeatable`)
	addExpectedGeneration(cmd, &generation)
	addDryRun(cmd, &dryRun)
	return cmd
}

func (a *App) backendsRemoveCommand() *cobra.Command {
	var (
		generation uint64
		dryRun     bool
	)
	cmd := &cobra.Command{
		Use:     "remove SERVICE IP [IP...]",
		Aliases: []string{"rm"},
		Short:   "Remove backends from a service",
		Long: `Remove backends from a service by IP.

An IP the service does not have is named on standard error ("service/web has
no backend 10.0.0.9"); the others are still removed. Only when none of the
IPs was there does the command fail, with exit code 3, as nothing changed.`,
		Args: cobra.MinimumNArgs(2),
		RunE: a.run(func(ctx context.Context, args []string) error {
			return a.updateBackends(ctx, &vipdv1.UpdateBackendsRequest{
				Name: args[0], Remove: args[1:], ExpectedGeneration: generation, ValidateOnly: dryRun,
			})
		}),
	}
	addExpectedGeneration(cmd, &generation)
	addDryRun(cmd, &dryRun)
	return cmd
}

// addDryRun adds the --dry-run flag of the commands that vipd can check
// without changing anything.
func addDryRun(cmd *cobra.Command, dryRun *bool) {
	cmd.Flags().BoolVar(dryRun, "dry-run", false, "have vipd check the change and print what would happen, changing nothing")
}

func (a *App) backendsListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "list SERVICE",
		Aliases: []string{"ls"},
		Short:   "List the backends of a service",
		Long:    `List the backends of a service. -o json prints {"backends": [...]}.`,
		Args:    cobra.ExactArgs(1),
		RunE: a.run(func(ctx context.Context, args []string) error {
			return a.withClient(func(c *client.Client) error {
				svc, err := c.GetService(ctx, args[0])
				if err != nil {
					return err
				}
				msg, err := listOf("backends", svc.GetBackends())
				if err != nil {
					return err
				}
				return a.printer().show(msg, backendsView(svc.GetBackends(), svc.GetPorts()...))
			})
		}),
	}
}

// updateBackends sends req and reports the result. IPs to remove that the
// service did not have are named on the error stream, and are an error
// when none of them was there.
func (a *App) updateBackends(ctx context.Context, req *vipdv1.UpdateBackendsRequest) error {
	return a.withClient(func(c *client.Client) error {
		resp, err := c.LoadBalancerClient().UpdateBackends(ctx, req)
		if err != nil {
			return err
		}
		svc := resp.GetService()
		var ips []string
		done := "removed"
		for _, ip := range req.GetRemove() {
			if !slices.Contains(resp.GetAbsent(), ip) {
				ips = append(ips, ip)
			}
		}
		if len(req.GetUpsert()) > 0 {
			done = "added or replaced"
			for _, b := range req.GetUpsert() {
				ips = append(ips, b.GetIp())
			}
		}
		if len(resp.GetAbsent()) > 0 && len(ips) == 0 {
			return status.Errorf(codes.NotFound, "service/%s has no backend %s: nothing removed", svc.GetName(), strings.Join(resp.GetAbsent(), ", "))
		}
		for _, ip := range resp.GetAbsent() {
			fmt.Fprintf(a.streams.Err, "service/%s has no backend %s\n", svc.GetName(), ip)
		}
		note := fmt.Sprintf("(generation %d)", svc.GetGeneration())
		if req.GetValidateOnly() {
			note = "(dry run)"
		}
		return a.printer().show(svc, func(t *table) {
			t.row(fmt.Sprintf("service/%s backends %s %s %s", svc.GetName(), strings.Join(ips, ", "), done, note))
		})
	})
}

// parsePorts parses --port NAME=PORT flags; =PORT, with the empty name,
// is for the only port of a service whose port has no name.
func parsePorts(flags []string) (map[string]uint32, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	ports := map[string]uint32{}
	for _, f := range flags {
		name, value, ok := strings.Cut(f, "=")
		if !ok {
			return nil, usageErrorf("--port %q: want NAME=PORT, or =PORT for the service's unnamed port", f)
		}
		p, err := strconv.ParseUint(value, 10, 16)
		if err != nil || p == 0 {
			return nil, usageErrorf("--port %q: %q is not a port number 1-65535", f, value)
		}
		ports[name] = uint32(p)
	}
	return ports, nil
}
