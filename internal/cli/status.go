package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/version"
	"google.golang.org/protobuf/types/known/structpb"
)

func (a *App) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show vipd's dataplane, counts and last sync",
		Args:  cobra.NoArgs,
		RunE: a.run(func(ctx context.Context, _ []string) error {
			return a.withClient(func(c *client.Client) error {
				st, err := c.Status(ctx)
				if err != nil {
					return err
				}
				return a.printer().show(st, statusView(st))
			})
		}),
	}
}

func (a *App) versionCommand() *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show the versions of vipctl and vipd",
		Long: `Show the versions of vipctl and vipd. When vipd cannot be asked, vipctl's
version is shown and the command fails; --client (or "vipctl --version")
skips vipd.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(ctx context.Context, _ []string) error {
			return a.showVersion(ctx, clientOnly)
		}),
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "show only vipctl's version")
	return cmd
}

// showVersion prints vipctl's version and, unless clientOnly, vipd's.
func (a *App) showVersion(ctx context.Context, clientOnly bool) error {
	versions := map[string]any{"clientVersion": version.String()}
	var serverErr error
	if !clientOnly {
		serverErr = a.withClient(func(c *client.Client) error {
			st, err := c.Status(ctx)
			if err != nil {
				return fmt.Errorf("ask vipd for its version: %w", err)
			}
			versions["serverVersion"] = st.GetVersion()
			return nil
		})
	}
	msg, err := structpb.NewStruct(versions)
	if err != nil {
		return err
	}
	err = a.printer().show(msg, func(t *table) {
		t.field("Client version", version.String())
		if v, ok := versions["serverVersion"].(string); ok {
			t.field("Server version", v)
		}
	})
	return errors.Join(serverErr, err)
}
