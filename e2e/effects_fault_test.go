package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	effects "github.com/oncegate/oncegate/client/effects"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// The effects ledger's fault rows (issue 47), with real processes killed by SIGKILL: the
// gateway node that answered a claim, and the caller that holds one in the middle of its
// side effect. In both the effect ran once; what follows the kill is a lapsed lease, a new
// fence, the old one refused, and needs_reconcile, never a second run.

// effectAnswer is an effects API answer (a claim's, a completion's, a list's entry).
type effectAnswer struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Attempt   int    `json:"attempt"`
	Fence     uint64 `json:"fence"`
	EffectKey string `json:"effect_key"`
}

// TestEffectsFaultClaimNodeKilled: the node that answered a claim is killed (SIGKILL) while
// the claim is held. Through the other node, on the same three-node NATS cluster, a claim is
// told in_progress while the lease lives, then needs_reconcile with a fence above the old one
// once it lapsed; the old fence can neither complete, renew nor report the effect; the list
// shows the one effect needing reconciliation; nothing ever reports it completed, and the
// effect body (the caller's, counted here) ran once.
func TestEffectsFaultClaimNodeKilled(t *testing.T) {
	t.Parallel() // processes and ports of its own; mostly waiting
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := oncegateBinary(t)
	cluster := testkit.RunCluster(t, 3)
	natsURL := strings.Join(cluster.URLs(), ",")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "oncegate.yaml")
	cfg := "log_level: warn\nidempotency: {lease: 2s, renew_every: 500ms}\nworkers: {sweep_every: 1s}\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := &chaosEnv{t: t, bin: bin} // its start: one node at a time, each ready before the next
	nodes := make([]*gwNode, 2)
	for i, name := range []string{"node-a", "node-b"} {
		addr := testkit.FreeAddr(t)
		nodes[i] = &gwNode{name: name, base: "http://" + addr, args: []string{"serve", "--config", cfgPath,
			"--listen", addr, "--data-dir", filepath.Join(dir, name), "--nats-url", natsURL}}
		env.start(nodes[i])
	}
	a, b := nodes[0], nodes[1]

	const key, name = "fault-node-killed", "send_email"
	expect(t, postChat(t, a.base, mockBody("the node holding the claim dies", `{"inter_token_ms":0}`, ""),
		map[string]string{"Idempotency-Key": key}), http.StatusOK, "created")
	fp, err := effects.Fingerprint(map[string]string{"to": "ops@example.com", "subject": "node killed"})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32 // the effect body: the caller's, run on every 201
	claim := func(base string) (result, effectAnswer) {
		t.Helper()
		r := do(t, http.MethodPost, effectURL(base, key, name, ""), fmt.Sprintf(`{"fingerprint":%q,"lease_ms":1500}`, fp), nil)
		var v effectAnswer
		_ = json.Unmarshal(r.Body, &v)
		switch {
		case r.Status == http.StatusCreated:
			runs.Add(1)
		case v.State == "completed":
			t.Fatalf("a claim answered %d %s: nothing completed the effect", r.Status, r.Body)
		}
		return r, v
	}

	first, held := claim(a.base)
	if first.Status != http.StatusCreated || held.State != "claimed" || held.Fence == 0 {
		t.Fatalf("the claim through %s: %d %s, want 201 claimed with a fence", a.name, first.Status, first.Body)
	}
	a.p.kill(t)

	// Through the other node: in_progress while the dead node's claim lives (on a slow
	// machine it may have lapsed already), then needs_reconcile with a new fence.
	var reconcile effectAnswer
	waited := 0
	testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
		r, v := claim(b.base)
		switch {
		case r.Status == http.StatusCreated:
			t.Fatalf("a claim through %s after the kill was granted (%s): the effect would run a second time", b.name, r.Body)
		case r.Status == http.StatusConflict && v.State == "in_progress":
			if r.Header.Get("Retry-After") == "" {
				t.Fatalf("409 in_progress without Retry-After: %s", r.Body)
			}
			waited++
			return errors.New("the dead node's claim is still in progress")
		case r.Status == http.StatusConflict && v.State == "needs_reconcile":
			reconcile = v
			return nil
		}
		t.Fatalf("a claim through %s after the kill: %d %s, want 409 in_progress or needs_reconcile", b.name, r.Status, r.Body)
		return nil
	})
	if reconcile.Fence <= held.Fence || reconcile.EffectKey != held.EffectKey || reconcile.Attempt != held.Attempt {
		t.Fatalf("after the lapse: %+v, want the same effect key and attempt as the claim %+v, a fence above %d", reconcile, held, held.Fence)
	}
	t.Logf("told in_progress %d times, then needs_reconcile with fence %d (the claim's: %d)", waited, reconcile.Fence, held.Fence)
	// Claimed again, it stays as it is: the same fence, no run.
	if r, v := claim(b.base); r.Status != http.StatusConflict || v != reconcile {
		t.Fatalf("a claim again: %d %s, want 409 and %+v", r.Status, r.Body, reconcile)
	}

	// The dead node's claim holder, its fence now stale, is refused whatever it writes.
	for _, w := range []struct{ method, suffix, body string }{
		{http.MethodPut, "", fmt.Sprintf(`{"fence":%d,"result":{"sent":true}}`, held.Fence)},
		{http.MethodPost, "/renew", fmt.Sprintf(`{"fence":%d,"lease_ms":1500}`, held.Fence)},
		{http.MethodPost, "/unknown", fmt.Sprintf(`{"fence":%d}`, held.Fence)},
	} {
		expectError(t, do(t, w.method, effectURL(b.base, key, name, w.suffix), w.body, nil), http.StatusConflict, "effect_stale_fence")
	}

	list := do(t, http.MethodGet, b.base+"/v1/idempotency/"+key+"/effects", "", nil)
	var listed struct{ Data []effectAnswer }
	if err := json.Unmarshal(list.Body, &listed); err != nil || list.Status != http.StatusOK || len(listed.Data) != 1 ||
		listed.Data[0] != (effectAnswer{Name: name, State: "needs_reconcile", Attempt: held.Attempt, Fence: reconcile.Fence, EffectKey: held.EffectKey}) {
		t.Fatalf("the list: %d %s, want the one effect needing reconciliation with fence %d", list.Status, list.Body, reconcile.Fence)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the effect body ran %d times, want 1", n)
	}
}

// Environment of the caller process of TestEffectsFaultCallerKilled (TestEffectsCallerProcess).
const (
	envEffectsCaller = "OG_EFFECTS_CALLER" // the gateway's base URL
	envEffectsKey    = "OG_EFFECTS_KEY"    // the intent's Idempotency-Key
	envEffectsDir    = "OG_EFFECTS_DIR"    // the downstream system: a file per effect, named by its effect key
)

// callerEffectName and callerEffectArgs are the effect the caller process runs.
const callerEffectName = "call_charge_card"

var callerEffectArgs = json.RawMessage(`{"card":"4242","amount_cents":1999}`)

// callerLease is the caller's claim lease: Do renews it every third of it while fn runs.
const callerLease = time.Second

// callerFence is the fence of the caller's claim: the effect's first.
const callerFence = 1

// TestEffectsCallerProcess is the caller of TestEffectsFaultCallerKilled, run as a process of
// its own (this test binary run again); it returns at once in a normal test run. Through the
// effects client it claims the effect, does its side effect (a file named by the effect key
// with the charge's record: the downstream system) and then hangs inside fn, renewing its
// claim, until it is killed.
func TestEffectsCallerProcess(t *testing.T) {
	base := os.Getenv(envEffectsCaller)
	if base == "" {
		return
	}
	c := &effects.Client{BaseURL: base, HTTP: httpClient, Lease: callerLease}
	_, err := c.Do(context.Background(), os.Getenv(envEffectsKey), callerEffectName, callerEffectArgs, func(_ context.Context, effectKey string) (any, error) {
		record := fmt.Sprintf(`{"charged":true,"effect_key":%q,"by":"the killed caller"}`, effectKey)
		path := filepath.Join(os.Getenv(envEffectsDir), effectKey)
		if err := os.WriteFile(path+".tmp", []byte(record), 0o600); err != nil {
			return nil, effects.NotRun(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil { // the whole record, or none
			return nil, effects.NotRun(err)
		}
		// Hung after the side effect; the test kills the process. Bounded, so that a caller whose
		// test went away does not outlive it: it exits as if killed, reporting nothing.
		<-time.After(time.Minute)
		os.Exit(3)
		return nil, nil
	})
	t.Fatalf("the caller's Do returned (%v); it should have been killed inside fn", err)
}

// TestEffectsFaultCallerKilled: the caller, a process of its own, is killed (SIGKILL) after its
// side effect and before recording it, while Do renews its claim. The retried Do never runs
// the effect again: once the lease lapsed it returns a *ReconcileError with the effect key and
// a new fence. A Do whose Reconcile finds the effect downstream by its effect key records what
// was found; from then on Do returns that record, byte for byte, without running fn.
func TestEffectsFaultCallerKilled(t *testing.T) {
	t.Parallel() // a process of its own; mostly waiting
	if testing.Short() {
		t.Skip("runs the caller as a process")
	}
	gw := gatewaykit.StartGateway(t, gatewaykit.Config(t))
	const key = "fault-caller-killed"
	expect(t, postChat(t, gw.URL, mockBody("the caller dies mid-effect", `{"inter_token_ms":0}`, ""),
		map[string]string{"Idempotency-Key": key}), http.StatusOK, "created")

	downstream := t.TempDir()
	caller := startProcEnv(t, "caller", []string{envEffectsCaller + "=" + gw.URL, envEffectsKey + "=" + key, envEffectsDir + "=" + downstream},
		os.Args[0], "-test.run=^TestEffectsCallerProcess$")
	var effectKey string
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if caller.exited() {
			t.Fatalf("the caller exited before its side effect: %v", caller.err)
		}
		files, err := os.ReadDir(downstream)
		for _, f := range files {
			if !strings.HasSuffix(f.Name(), ".tmp") {
				effectKey = f.Name()
				return nil
			}
		}
		return fmt.Errorf("the caller has not done its side effect yet (%v)", err)
	})
	// Killed once it has renewed its claim: alive and holding it until the kill stops that.
	reg := gw.Metrics().Registry()
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if n := effectEvents(t, reg, "renewed"); n < 1 {
			return errors.New("the caller has not renewed its claim yet")
		}
		return nil
	})
	list := do(t, http.MethodGet, gw.URL+"/v1/idempotency/"+key+"/effects", "", nil)
	if !strings.Contains(string(list.Body), `"name":"`+callerEffectName+`","state":"claimed"`) {
		t.Fatalf("the list while the caller hangs: %d %s, want the effect claimed", list.Status, list.Body)
	}
	caller.kill(t)

	var runs atomic.Int32
	counting := func(context.Context, string) (any, error) {
		runs.Add(1)
		return map[string]bool{"charged": true}, nil
	}
	c := &effects.Client{BaseURL: gw.URL, HTTP: httpClient}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Told in_progress while the dead caller's lease lives, Do waits (Retry-After) and claims
	// again, until the lease lapsed: then the effect needs reconciling.
	_, err := c.Do(ctx, key, callerEffectName, callerEffectArgs, counting)
	var rerr *effects.ReconcileError
	if !errors.As(err, &rerr) || !errors.Is(err, effects.ErrNeedsReconcile) {
		t.Fatalf("Do after the caller was killed: %v (fn ran %d times), want a *ReconcileError and no run", err, runs.Load())
	}
	if rerr.EffectKey != effectKey || rerr.Fence <= callerFence || rerr.Attempt != 1 || runs.Load() != 0 {
		t.Fatalf("%+v (fn ran %d times); want the effect key %s the caller used, attempt 1, a fence above the caller's %d, fn not run", rerr, runs.Load(), effectKey, callerFence)
	}
	t.Logf("before the reconcile error: the caller's claim renewed %v times, Do told in_progress %v times", effectEvents(t, reg, "renewed"), effectEvents(t, reg, "in_progress"))
	// The caller's completion with its fence, had it come back, is refused.
	late := do(t, http.MethodPut, effectURL(gw.URL, key, callerEffectName, ""), fmt.Sprintf(`{"fence":%d,"result":{"late":true}}`, callerFence), nil)
	expectError(t, late, http.StatusConflict, "effect_stale_fence")

	// Reconciled: the charge is found downstream by its effect key and recorded.
	record, err := os.ReadFile(filepath.Join(downstream, effectKey))
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	c.Reconcile = func(_ context.Context, k string) (json.RawMessage, bool, error) {
		asked = append(asked, k)
		b, err := os.ReadFile(filepath.Join(downstream, k))
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, nil
		}
		return b, err == nil, err
	}
	out, err := c.Do(ctx, key, callerEffectName, callerEffectArgs, counting)
	if err != nil || string(out) != string(record) || len(asked) != 1 || asked[0] != effectKey {
		t.Fatalf("Do with a reconciler: %s %v (asked %q), want the downstream record %s", out, err, asked, record)
	}
	// From then on: the recorded result, without fn or the reconciler.
	c.Reconcile = nil
	out, err = c.Do(ctx, key, callerEffectName, callerEffectArgs, counting)
	if err != nil || string(out) != string(record) || runs.Load() != 0 || len(asked) != 1 {
		t.Fatalf("Do after reconciling: %s %v (fn ran %d times), want the record %s and no run", out, err, runs.Load(), record)
	}
}
