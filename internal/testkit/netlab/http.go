package netlab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// HTTPClient returns an HTTP client whose connections are made inside n,
// one per request (no keep-alive), each request bounded by timeout.
func (n *NS) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := n.Do(func() error {
					var err error
					c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
					return err
				})
				return c, err
			},
		},
	}
}

// GetJSON makes one HTTP GET of url from inside n and decodes the body,
// whatever the status, as JSON into v. It returns the status code; an
// error also when the body is not JSON, quoting it.
func (n *NS) GetJSON(ctx context.Context, url string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := n.HTTPClient(0).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return resp.StatusCode, fmt.Errorf("HTTP %d with body %q: %w", resp.StatusCode, body, err)
	}
	return resp.StatusCode, nil
}
