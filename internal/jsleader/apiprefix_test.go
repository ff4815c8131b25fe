package jsleader_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsleader"
	"github.com/oncegate/oncegate/internal/testkit"
)

// TestAPIPrefix: a request sent by hand goes to the API prefix the JetStream handle uses: the default,
// an explicit prefix (with or without its dot), or a domain's.
func TestAPIPrefix(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	for _, tc := range []struct {
		name string
		js   func() (jetstream.JetStream, error)
		want string
	}{
		{"default", func() (jetstream.JetStream, error) { return jetstream.New(srv.NC) }, "$JS.API."},
		{"prefix", func() (jetstream.JetStream, error) { return jetstream.NewWithAPIPrefix(srv.NC, "hub.API") }, "hub.API."},
		{"prefix with its dot", func() (jetstream.JetStream, error) { return jetstream.NewWithAPIPrefix(srv.NC, "hub.API.") }, "hub.API."},
		{"domain", func() (jetstream.JetStream, error) { return jetstream.NewWithDomain(srv.NC, "leaf") }, "$JS.leaf.API."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, err := tc.js()
			if err != nil {
				t.Fatal(err)
			}
			if got := jsleader.APIPrefix(js); got != tc.want {
				t.Fatalf("APIPrefix = %q, want %q", got, tc.want)
			}
		})
	}
}
