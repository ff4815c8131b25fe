package testkit

import (
	"fmt"
	"net/http"
)

// Ready asks a gateway's GET base/readyz once and returns nil on 200, else what it got: the
// condition of a CheckFor that waits for a started gateway to serve.
func Ready(client *http.Client, base string) error {
	resp, err := client.Get(base + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz %d", resp.StatusCode)
	}
	return nil
}
