package e2e

import (
	"flag"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
)

var (
	jobTiming  = flag.Bool("timing", false, "run TestJobNotFoundTiming (a measurement: it prints, it asserts no time)")
	jobTimingN = flag.Int("timing.n", 2000, "lookups of each kind (foreign and missing)")
)

// TestJobNotFoundTiming measures GET /v1/jobs/{id} for another tenant's job id and for an id
// that does not exist, over real HTTP on 127.0.0.1 against a real embedded gateway: N lookups
// of each kind, interleaved (foreign, missing, foreign, ...), and prints the median latency of
// each and their difference. Both must answer the same 404; the times are printed, never
// asserted (a shared machine is noisy). Run with -timing.
func TestJobNotFoundTiming(t *testing.T) {
	if !*jobTiming {
		t.Skip("a measurement: run with -timing")
	}
	gw := gatewaykit.StartGateway(t, tenantsConfig(t))
	asA := map[string]string{"Authorization": "Bearer sk-a"}
	asB := map[string]string{"Authorization": "Bearer sk-b"}

	r := postChat(t, gw.URL, chatBody(config.MockModel, "job timing", ""), asA)
	expect(t, r, http.StatusOK, "created")
	jobA := r.Header.Get("Oncegate-Job-Id")
	testkit.CheckFor(t, 5*time.Second, pollEvery, func() error { // the job index is written asynchronously
		if r := send(http.MethodGet, gw.URL+"/v1/jobs/"+jobA, "", asA); r.Status != http.StatusOK {
			return fmt.Errorf("tenant a does not see its job: %d %s", r.Status, r.Body)
		}
		return nil
	})

	lookup := func(id string) (time.Duration, []byte) {
		t.Helper()
		r := do(t, http.MethodGet, gw.URL+"/v1/jobs/"+id, "", asB)
		if r.Status != http.StatusNotFound {
			t.Fatalf("GET /v1/jobs/%s as tenant b: %d %s; want 404", id, r.Status, r.Body)
		}
		return r.End.Sub(r.Start), r.Body
	}
	// Warm up the connection, the server and both paths.
	for range 200 {
		lookup(jobA)
		lookup(jobs.NewID())
	}
	n := *jobTimingN
	foreign, missing := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range n {
		order := []bool{true, false}
		if i%2 == 1 { // alternate which kind goes first
			order = []bool{false, true}
		}
		for _, isForeign := range order {
			if isForeign {
				d, _ := lookup(jobA)
				foreign = append(foreign, d)
			} else {
				d, _ := lookup(jobs.NewID())
				missing = append(missing, d)
			}
		}
	}
	_, fb := lookup(jobA)
	_, mb := lookup(jobs.NewID())
	if string(fb) != string(mb) {
		t.Errorf("foreign and missing ids answer different 404 bodies:\n%s\n%s", fb, mb)
	}
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	mf, mm := med(foreign), med(missing)
	t.Logf("GET /v1/jobs/{id} 404, %d interleaved lookups of each: median foreign %v, median missing %v, difference (foreign - missing) %v",
		n, mf, mm, mf-mm)
	fmt.Printf("job 404 timing: n=%d median foreign=%v missing=%v diff=%v\n", n, mf, mm, mf-mm)
}
