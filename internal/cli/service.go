package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

func (a *App) serviceCommand() *cobra.Command {
	return a.group(&cobra.Command{
		Use:     "service",
		Aliases: []string{"services", "svc"},
		Short:   "List, show and delete services",
	},
		a.serviceListCommand(),
		a.serviceGetCommand(),
		a.serviceDeleteCommand(),
	)
}

func (a *App) serviceListCommand() *cobra.Command {
	var owner string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List services, sorted by name",
		Long: `List services, sorted by name: all of them, or those of one owner.

PORTS shows port/protocol→target port; BACKENDS shows ready/total.
-o json prints {"services": [...]}, which "vipctl apply -f" reads back.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(ctx context.Context, _ []string) error {
			return a.withClient(func(c *client.Client) error {
				svcs, err := c.ListServices(ctx, owner)
				if err != nil {
					return err
				}
				return a.printer().show(&vipdv1.ListServicesResponse{Services: svcs}, servicesView(svcs))
			})
		}),
	}
	cmd.Flags().StringVar(&owner, "owner", "", "list only the services of this owner")
	return cmd
}

func (a *App) serviceGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show one service with its backends",
		Long: `Show one service with its backends.

With a health check, a Health section shows each probed backend's result:
passing, failing or unknown (no check finished yet: treated as passing),
since when, how many in a row, and why.

-o json and -o yaml print the service as "vipctl apply -f" reads it.`,
		Args: cobra.ExactArgs(1),
		RunE: a.run(func(ctx context.Context, args []string) error {
			return a.withClient(func(c *client.Client) error {
				resp, err := c.LoadBalancerClient().GetService(ctx, &vipdv1.GetServiceRequest{Name: args[0]})
				if err != nil {
					return err
				}
				svc := resp.GetService()
				return a.printer().show(svc, serviceView(svc, resp.GetBackendHealth()...))
			})
		}),
	}
}

func (a *App) serviceDeleteCommand() *cobra.Command {
	var generation uint64
	cmd := &cobra.Command{
		Use:     "delete NAME",
		Aliases: []string{"rm"},
		Short:   "Delete one service",
		Long: `Delete one service. It returns once the kernel no longer forwards it.

With --expected-generation, the delete fails (exit code 5) unless the
service still has that generation.`,
		Args: cobra.ExactArgs(1),
		RunE: a.run(func(ctx context.Context, args []string) error {
			return a.withClient(func(c *client.Client) error {
				if err := c.DeleteService(ctx, args[0], generation); err != nil {
					return err
				}
				return a.printer().show(&vipdv1.DeleteServiceResponse{}, func(t *table) {
					t.row(fmt.Sprintf("service/%s deleted", args[0]))
				})
			})
		}),
	}
	addExpectedGeneration(cmd, &generation)
	return cmd
}

// addExpectedGeneration adds the --expected-generation flag of the commands
// that change one service.
func addExpectedGeneration(cmd *cobra.Command, generation *uint64) {
	cmd.Flags().Uint64Var(generation, "expected-generation", 0, "fail unless the service has this generation (0: unconditional)")
}
