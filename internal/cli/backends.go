package cli

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
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
			return a.updateBackends(ctx, args[0], backends, nil, generation, "added or replaced")
		}),
	}
	f := cmd.Flags()
	f.Uint32Var(&weight, "weight", 0, "weight, 1-65535 (0: 1)")
	f.StringVar(&state, "state", "", "state: ready, terminating or not-serving (default ready)")
	f.BoolVar(&nodeLocal, "node-local", false, "the backends run on this node")
	f.StringVar(&zone, "zone", "", "topology zone of the backends")
	f.StringArrayVar(&ports, "port", nil, "NAME=PORT: the backends' target port for the service port NAME; repeatable")
	addExpectedGeneration(cmd, &generation)
	return cmd
}

func (a *App) backendsRemoveCommand() *cobra.Command {
	var generation uint64
	cmd := &cobra.Command{
		Use:     "remove SERVICE IP [IP...]",
		Aliases: []string{"rm"},
		Short:   "Remove backends from a service",
		Long:    `Remove backends from a service by IP. IPs the service does not have are ignored.`,
		Args:    cobra.MinimumNArgs(2),
		RunE: a.run(func(ctx context.Context, args []string) error {
			return a.updateBackends(ctx, args[0], nil, args[1:], generation, "removed")
		}),
	}
	addExpectedGeneration(cmd, &generation)
	return cmd
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

// updateBackends sends one UpdateBackends and reports the result; done says
// what happened to the IPs.
func (a *App) updateBackends(ctx context.Context, name string, upsert []*vipdv1.Backend, remove []string, generation uint64, done string) error {
	return a.withClient(func(c *client.Client) error {
		svc, err := c.UpdateBackends(ctx, name, upsert, remove, generation)
		if err != nil {
			return err
		}
		ips := remove
		for _, b := range upsert {
			ips = append(ips, b.GetIp())
		}
		return a.printer().show(svc, func(t *table) {
			t.row(fmt.Sprintf("service/%s backends %s %s (generation %d)", svc.GetName(), strings.Join(ips, ", "), done, svc.GetGeneration()))
		})
	})
}

// parsePorts parses --port NAME=PORT flags.
func parsePorts(flags []string) (map[string]uint32, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	ports := map[string]uint32{}
	for _, f := range flags {
		name, value, ok := strings.Cut(f, "=")
		if !ok || name == "" {
			return nil, usageErrorf("--port %q: want NAME=PORT", f)
		}
		p, err := strconv.ParseUint(value, 10, 16)
		if err != nil || p == 0 {
			return nil, usageErrorf("--port %q: %q is not a port number 1-65535", f, value)
		}
		ports[name] = uint32(p)
	}
	return ports, nil
}
