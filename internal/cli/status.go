package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/version"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
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

// warningsView ends the status view with a "Warnings:" block when vipd
// reports any: per warning, a line with its check, message and since when,
// and an indented line with the remedy. Without warnings it prints
// nothing, so that the key/value lines above stay the whole output.
func warningsView(t *table, ws []*vipdv1.StatusWarning) {
	if len(ws) == 0 {
		return
	}
	t.section()
	fmt.Fprintln(t.tw, "Warnings:")
	for _, w := range ws {
		since := ""
		if w.GetSince() != nil {
			since = " (since " + w.GetSince().AsTime().UTC().Format(time.RFC3339) + ")"
		}
		fmt.Fprintf(t.tw, "  %s: %s%s\n", w.GetCheck(), w.GetMessage(), since)
		if w.GetRemedy() != "" {
			fmt.Fprintf(t.tw, "    fix: %s\n", w.GetRemedy())
		}
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
