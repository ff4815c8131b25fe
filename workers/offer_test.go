package workers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TestOfferedRecord: a job whose record this node offered (Pool.Offer: the admission that
// submitted it) runs from that record, not from a decode of the message; an offer for another
// revision of the key is not taken. To tell the two apart the offered record's request differs
// from the one in the message (the mock counts a prompt's words as its tokens); in the gateway
// they are the same record.
func TestOfferedRecord(t *testing.T) {
	r := start(t, time.Hour)
	ctx := context.Background()
	chat := func(words int) string {
		return `{"model":"oncegate-mock","messages":[{"role":"user","content":"` + strings.TrimSpace(strings.Repeat("w ", words)) + `"}]}`
	}
	for i, tc := range []struct {
		name     string
		revShift uint64 // the offer's revision past the job's
		want     int    // prompt tokens the backend saw
	}{
		{name: "offered", want: 7},
		{name: "offered for another revision", revShift: 1, want: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "offer" + string(rune('a'+i))
			rec, rev := r.claimWith(t, key, chat(3), func(*kv.Record) {})
			offered := rec.WithRequest([]byte(chat(7)))
			defer r.pool.Offer(key, rec.Epoch, rev+tc.revShift, offered)()
			if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
				t.Fatal(err)
			}
			got := r.waitFinal(t, key)
			if got.State != kv.Completed || got.Result.Usage == nil || got.Result.Usage.PromptTokens != tc.want {
				t.Fatalf("state %s usage %+v; want COMPLETED with %d prompt tokens", got.State, got.Result.Usage, tc.want)
			}
		})
	}
}
