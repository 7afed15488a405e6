package cli

import (
	"context"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

func (a *App) nodeCommand() *cobra.Command {
	return a.group(&cobra.Command{
		Use:   "node",
		Short: "Set what vipd knows about its node",
	},
		a.nodeSetZoneCommand(),
	)
}

func (a *App) nodeSetZoneCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "set-zone ZONE",
		Short: "Set the node's topology zone (\"\" for none)",
		Long: `Set the node's topology zone, the one that services with a
traffic_distribution prefer and backends' for_zones hints are matched
against: what "vipd run --zone" sets at start. An empty ZONE ("") leaves the
node without a zone. It returns once the dataplane has applied it. vipd does
not keep it across a restart: the --zone flag is the start value.`,
		Args: cobra.ExactArgs(1),
		RunE: a.run(func(ctx context.Context, args []string) error {
			return a.withClient(func(c *client.Client) error {
				resp, err := c.NodeClient().SetNodeTopology(ctx, &vipdv1.SetNodeTopologyRequest{Zone: args[0]})
				if err != nil {
					return err
				}
				return a.printer().show(resp, func(t *table) {
					t.field("Zone", resp.GetZone())
					t.field("Previous zone", resp.GetPreviousZone())
				})
			})
		}),
	}
}
