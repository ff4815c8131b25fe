package ledger_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/ledgerkit"
	"github.com/oncegate/oncegate/ledger"
)

var (
	testSecret  = []byte("0123456789abcdef0123456789abcdef-test-secret")
	otherSecret = []byte("fedcba9876543210fedcba9876543210-other-secret")
	headsTime   = time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
)

// keyedGolden is the clean golden export with every chain keyed under testSecret from its
// first entry (from 0) or from index from on (a mixed chain).
func keyedGolden(t *testing.T, from int) []ledger.Entry {
	es := readGolden(t, "clean", ledger.FormatJSONL)
	for _, tenant := range []string{"acme", "globex"} {
		es = ledgerkit.Rechain(es, tenant, from, testSecret)
	}
	return es
}

// headsOf anchors es: the heads file `oncegate ledger head` would write for it.
func headsOf(t *testing.T, es []ledger.Entry, secret []byte) *ledger.Heads {
	t.Helper()
	r := ledger.Check(es, ledger.VerifyOptions{Secret: secret})
	if len(r.Findings) > 0 {
		t.Fatalf("anchoring a broken chain: %v", r.Findings)
	}
	return ledger.NewHeads(r.Heads, headsTime, secret)
}

func lastOf(es []ledger.Entry, tenant string) int {
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Tenant == tenant {
			return i
		}
	}
	return -1
}

func without(es []ledger.Entry, drop func(i int, e *ledger.Entry) bool) []ledger.Entry {
	var out []ledger.Entry
	for i := range es {
		if !drop(i, &es[i]) {
			out = append(out, es[i])
		}
	}
	return out
}

// TestCheckAnchor: each tampering the hash chain alone cannot see is found against the
// anchored heads (or, keyed, without them); a clean ledger and one grown since its anchor pass.
func TestCheckAnchor(t *testing.T) {
	clean := func(t *testing.T) []ledger.Entry { return readGolden(t, "clean", ledger.FormatJSONL) }
	tests := []struct {
		name string
		// ledger builds the checked entries and the heads (nil: no anchor).
		ledger func(t *testing.T) ([]ledger.Entry, *ledger.Heads)
		opts   ledger.VerifyOptions
		// want are the findings' texts, in order (none: the ledger verifies); unanchored says
		// whether Check without the heads finds anything.
		want       []string
		unanchored bool
		anchored   int
		after      int
	}{
		{name: "clean", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := clean(t)
			return es, headsOf(t, es, nil)
		}, anchored: 2},
		{name: "appended after the anchor", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := clean(t)
			return es, headsOf(t, es[:5], nil)
		}, anchored: 2, after: 4},
		{name: "truncated", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := clean(t)
			h := headsOf(t, es, nil)
			last := lastOf(es, "acme")
			return without(es, func(i int, _ *ledger.Entry) bool { return i == last }), h
		}, want: []string{`tenant "acme": 6 entries, anchored with 7 entries to seq 9`, "cut from the end"}, anchored: 1},
		{name: "tenant removed", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := clean(t)
			h := headsOf(t, es, nil)
			return without(es, func(_ int, e *ledger.Entry) bool { return e.Tenant == "globex" }), h
		}, want: []string{`tenant "globex": anchored with 2 entries to seq 7`, "absent from the ledger: the tenant was removed"}, anchored: 1},
		{name: "recomputed after an edit", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := clean(t)
			h := headsOf(t, es, nil)
			es[2].CostMicros = 1 // acme's second entry, then its chain recomputed
			return ledgerkit.Rechain(es, "acme", 2, nil), h
		}, want: []string{`tenant "acme": entry 7 has hash`, "recomputed after an edit"}, anchored: 1},
		{name: "stream rebuilt", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := clean(t)
			h := headsOf(t, es, nil)
			for i := range es {
				es[i].Seq += 100 // the same entries, published again into a new stream
			}
			return es, h
		}, want: []string{`tenant "acme": entry 7 is at seq 109`, "the stream was rebuilt", `tenant "globex": entry 2 is at seq 107`}},
		{name: "keyed clean", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := keyedGolden(t, 0)
			return es, headsOf(t, es, testSecret)
		}, opts: ledger.VerifyOptions{Secret: testSecret, RequireKeyed: true}, anchored: 2},
		{name: "keyed, recomputed without the key", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := keyedGolden(t, 0)
			es[2].CostMicros = 1
			return ledgerkit.Rechain(es, "acme", 2, nil), nil
		}, opts: ledger.VerifyOptions{Secret: testSecret},
			want: []string{"entry 2", "an unkeyed entry after a keyed one"}, unanchored: true},
		{name: "keyed, every entry recomputed without the key", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := keyedGolden(t, 0)
			es[2].CostMicros = 1
			return ledgerkit.Rechain(es, "acme", 0, nil), nil
		}, opts: ledger.VerifyOptions{Secret: testSecret, RequireKeyed: true},
			want: []string{"entry 0", "every entry must be keyed"}, unanchored: true},
		{name: "keyed, recomputed under another key", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := keyedGolden(t, 0)
			es[2].CostMicros = 1
			return ledgerkit.Rechain(es, "acme", 2, otherSecret), nil
		}, opts: ledger.VerifyOptions{Secret: testSecret},
			want: []string{"entry 2", "keyed hash mismatch"}, unanchored: true},
		{name: "mixed chain", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := keyedGolden(t, 4) // unkeyed entries first, as before the secret was configured
			return es, headsOf(t, es, testSecret)
		}, opts: ledger.VerifyOptions{Secret: testSecret}, anchored: 2},
		{name: "mixed chain, keyed required", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			return keyedGolden(t, 4), nil
		}, opts: ledger.VerifyOptions{Secret: testSecret, RequireKeyed: true},
			want: []string{"entry 0", "every entry must be keyed", "entry 1", "every entry must be keyed"}, unanchored: true},
		{name: "heads altered", ledger: func(t *testing.T) ([]ledger.Entry, *ledger.Heads) {
			es := keyedGolden(t, 0)
			h := headsOf(t, es, testSecret)
			h.Heads[0].Count-- // the anchor made to fit a truncation
			return es, h
		}, opts: ledger.VerifyOptions{Secret: testSecret}, want: []string{"heads: the MAC does not match", `tenant "acme": entry 6 has hash`}, anchored: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			es, heads := tt.ledger(t)
			opts := tt.opts
			opts.Heads = heads
			r := ledger.Check(es, opts)
			var got []string
			for _, f := range r.Findings {
				got = append(got, f.Error())
			}
			all := strings.Join(got, "\n")
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("findings do not mention %q:\n%s", w, all)
				}
			}
			if len(tt.want) == 0 && len(got) > 0 {
				t.Errorf("findings on an untampered ledger:\n%s", all)
			}
			if len(tt.want) > 0 && r.Err() == nil {
				t.Errorf("Err() = nil with findings")
			}
			if r.Anchored != tt.anchored || r.After != tt.after {
				t.Errorf("anchored %d tenants, %d entries after; want %d, %d", r.Anchored, r.After, tt.anchored, tt.after)
			}
			for _, f := range r.Findings {
				if !errors.Is(f, ledger.ErrChainBroken) && !errors.Is(f, ledger.ErrAnchor) {
					t.Errorf("finding %v matches neither ErrChainBroken nor ErrAnchor", f)
				}
			}
			// What the anchor adds: without the heads these ledgers verify.
			opts.Heads = nil
			if u := ledger.Check(es, opts); (len(u.Findings) > 0) != tt.unanchored {
				t.Errorf("without the heads: findings %v, want findings: %v", u.Findings, tt.unanchored)
			}
		})
	}
}

// TestCheckWithoutSecret: a keyed chain checked without the secret does not pass silently:
// its links are checked (a removed entry is still found), its hashes are not, and Err says so.
func TestCheckWithoutSecret(t *testing.T) {
	es := keyedGolden(t, 4)
	r := ledger.Check(es, ledger.VerifyOptions{})
	if len(r.Findings) > 0 || r.Unchecked != 5 || r.Keyed != 5 || r.Unkeyed != 4 {
		t.Fatalf("findings %v, %d unchecked, %d keyed, %d unkeyed; want none, 5, 5, 4", r.Findings, r.Unchecked, r.Keyed, r.Unkeyed)
	}
	if err := r.Err(); !errors.Is(err, ledger.ErrUnchecked) || !strings.Contains(err.Error(), "5 keyed entries") {
		t.Fatalf("Err() = %v, want ErrUnchecked naming 5 keyed entries", err)
	}
	if err := ledger.Verify(es); !errors.Is(err, ledger.ErrUnchecked) {
		t.Fatalf("Verify = %v, want ErrUnchecked", err)
	}
	es[6].CostMicros = 1 // a keyed entry altered: not seen without the secret ...
	if r := ledger.Check(es, ledger.VerifyOptions{}); len(r.Findings) > 0 {
		t.Fatalf("without the secret a keyed entry's content is not checked, yet: %v", r.Findings)
	}
	if r := ledger.Check(es, ledger.VerifyOptions{Secret: testSecret}); len(r.Findings) != 1 || !strings.Contains(r.Findings[0].Error(), "keyed hash mismatch") {
		t.Fatalf("with the secret: %v, want one keyed hash mismatch", r.Findings)
	}
	es = append(es[:5:5], es[6:]...) // ... but a removed one is
	if r := ledger.Check(es, ledger.VerifyOptions{}); len(r.Findings) != 1 || !strings.Contains(r.Findings[0].Error(), "prev_hash") {
		t.Fatalf("a keyed entry removed, no secret: %v, want one broken link", r.Findings)
	}

	h := headsOf(t, keyedGolden(t, 0), testSecret)
	r = ledger.Check(keyedGolden(t, 0), ledger.VerifyOptions{Heads: h})
	if r.HeadsMAC != ledger.MACUnchecked || r.Anchored != 2 {
		t.Fatalf("signed heads without the secret: MAC %q, %d anchored", r.HeadsMAC, r.Anchored)
	}
	if r := ledger.Check(keyedGolden(t, 0), ledger.VerifyOptions{Heads: h, Secret: testSecret}); r.HeadsMAC != ledger.MACValid || r.Err() != nil {
		t.Fatalf("signed heads with the secret: MAC %q, %v", r.HeadsMAC, r.Err())
	}
}

// TestGoldenUnkeyedStillVerify: the committed (unkeyed, version 1) exports verify as before.
func TestGoldenUnkeyedStillVerify(t *testing.T) {
	r := ledger.Check(readGolden(t, "clean", ledger.FormatCSV), ledger.VerifyOptions{Secret: testSecret})
	if r.Err() != nil || r.Unkeyed != 9 || r.Keyed != 0 {
		t.Fatalf("clean golden with a secret: %v, %d unkeyed, %d keyed", r.Err(), r.Unkeyed, r.Keyed)
	}
}

func TestHeadsFile(t *testing.T) {
	h := headsOf(t, keyedGolden(t, 0), testSecret)
	var buf bytes.Buffer
	if err := ledger.WriteHeads(&buf, h); err != nil {
		t.Fatal(err)
	}
	back, err := ledger.ReadHeads(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if r := ledger.Check(keyedGolden(t, 0), ledger.VerifyOptions{Heads: back, Secret: testSecret}); r.Err() != nil || r.HeadsMAC != ledger.MACValid {
		t.Fatalf("heads read back: %v, MAC %q", r.Err(), r.HeadsMAC)
	}
	if len(back.Heads) != 2 || back.Heads[0].Tenant != "acme" || back.Heads[0].Count != 7 || back.Heads[1].Count != 2 ||
		!strings.HasPrefix(back.MAC, ledger.KeyedPrefix) {
		t.Fatalf("heads %+v", back)
	}
	good := buf.String()
	hash := h.Heads[0].Hash
	for _, tt := range []struct{ name, file, want string }{
		{"empty", "", "EOF"},
		{"not json", "heads", "invalid"},
		{"unknown field", strings.Replace(good, `"version"`, `"extra": 1, "version"`, 1), "unknown field"},
		{"version", strings.Replace(good, `"version": 1`, `"version": 2`, 1), "version 2"},
		{"trailing", good + "{}", "trailing data"},
		{"tenant twice", strings.Replace(good, `"tenant": "globex"`, `"tenant": "acme"`, 1), "twice"},
		{"empty tenant", strings.Replace(good, `"tenant": "globex"`, `"tenant": ""`, 1), "empty tenant"},
		{"count", strings.Replace(good, `"count": 2`, `"count": 0`, 1), "count 0"},
		{"hash", strings.Replace(good, hash, "hmac:xyz", 1), "not an entry hash"},
		{"mac", strings.Replace(good, h.MAC, "abc", 1), "mac"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ledger.ReadHeads(strings.NewReader(tt.file))
			if !errors.Is(err, ledger.ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadHeads: %v; want ErrCorrupt mentioning %q", err, tt.want)
			}
		})
	}
}

func FuzzReadHeads(f *testing.F) {
	h := ledger.NewHeads([]ledger.Head{{Tenant: "acme", Seq: 9, Count: 6, Hash: strings.Repeat("ab", 32), Time: headsTime}}, headsTime, testSecret)
	var buf bytes.Buffer
	if err := ledger.WriteHeads(&buf, h); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte(`{"version":1,"created":"2026-03-02T00:00:00Z","heads":[]}`))
	f.Add([]byte(`{"version":1,"created":"2026-03-02T00:00:00+01:00","heads":null,"mac":"hmac:` + strings.Repeat("0", 64) + `"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ledger.ReadHeads(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ledger.ErrCorrupt) {
				t.Fatalf("an error that is not ErrCorrupt: %v", err)
			}
			return
		}
		// What parses writes back to a file that parses to the same heads, whose MAC (over the
		// parsed content) is the same.
		var out bytes.Buffer
		if err := ledger.WriteHeads(&out, h); err != nil {
			t.Fatal(err)
		}
		back, err := ledger.ReadHeads(&out)
		if err != nil {
			t.Fatalf("written heads do not parse: %v\n%s", err, out.Bytes())
		}
		if back.MAC != h.MAC || len(back.Heads) != len(h.Heads) || !back.Created.Equal(h.Created) {
			t.Fatalf("round trip changed the heads: %+v -> %+v", h, back)
		}
		resigned := ledger.NewHeads(h.Heads, h.Created, testSecret)
		again := ledger.NewHeads(back.Heads, back.Created, testSecret)
		if resigned.MAC != again.MAC {
			t.Fatalf("the MAC of the same heads changed over a round trip")
		}
		if !slices.EqualFunc(h.Heads, back.Heads, func(a, b ledger.Head) bool {
			return a.Tenant == b.Tenant && a.Count == b.Count && a.Hash == b.Hash && a.Seq == b.Seq && a.Time.Equal(b.Time)
		}) {
			t.Fatalf("round trip changed the heads")
		}
	})
}

// TestAnchorLive: a keyed ledger on a real embedded JetStream: it verifies with the secret
// and against its heads, keeps verifying as it grows; the stream deleted and rebuilt from its
// own messages minus a tenant's last entry, minus a whole tenant, or with an entry edited and
// the chain recomputed without the key, is each found.
func TestAnchorLive(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, testPrices, "USD", ledger.WithSecret(testSecret), ledger.WithClock(newStepClock(goldenStart).Now))
	charge := func(tenant, key, job string) {
		t.Helper()
		if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: tenant, KeyHash: key, JobID: job, Epoch: 1, Attempt: 1,
			Model: "gpt-4o-mini", Backend: "openai", InputTokens: 1000, OutputTokens: 100, Completed: true}); err != nil {
			t.Fatal(err)
		}
	}
	charge("acme", k1, j1)
	charge("globex", k2, j2)
	charge("acme", k3, j3)
	entries := func() []ledger.Entry {
		t.Helper()
		es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	es := entries()
	if r := ledger.Check(es, ledger.VerifyOptions{Secret: testSecret, RequireKeyed: true}); r.Err() != nil || r.Keyed != 3 {
		t.Fatalf("live keyed chain: %v, %d keyed", r.Err(), r.Keyed)
	}
	heads := headsOf(t, es, testSecret)
	charge("acme", k4, j4) // appended after the anchor: fine
	if r := ledger.Check(entries(), ledger.VerifyOptions{Secret: testSecret, Heads: heads}); r.Err() != nil || r.After != 1 {
		t.Fatalf("grown after the anchor: %v, %d after", r.Err(), r.After)
	}

	// Each tampering rebuilds LEDGER from the raw messages as stored (by whoever can delete
	// the stream: DenyDelete does not stop DeleteStream).
	st, err := srv.JS.Stream(ctx, ledger.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	type raw struct {
		subject string
		data    []byte
	}
	var original []raw
	for seq := uint64(1); seq <= 4; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		original = append(original, raw{m.Subject, m.Data})
	}
	rebuild := func(t *testing.T, msgs []raw) []ledger.Entry {
		t.Helper()
		if err := srv.JS.DeleteStream(ctx, ledger.StreamName); err != nil {
			t.Fatal(err)
		}
		testkit.Recreate(t, func() error { return ledger.EnsureStream(ctx, srv.JS) })
		for _, m := range msgs {
			if _, err := srv.JS.Publish(ctx, m.subject, m.data); err != nil {
				t.Fatal(err)
			}
		}
		es, err := ledger.New(srv.JS, nil, "").Entries(ctx, "", time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	// unkeyedEdit is entry i (acme's second entry, seq 3) made cheaper and rehashed without the
	// key, as stored JSON.
	unkeyedEdit := func(t *testing.T, es []ledger.Entry, i int) raw {
		e := es[i]
		e.CostMicros = 1
		e.Hash = ledger.HashOf(&e)
		b, err := json.Marshal(struct {
			V int `json:"v"`
			ledger.Entry
		}{1, e})
		if err != nil {
			t.Fatal(err)
		}
		return raw{original[i].subject, b}
	}
	tests := []struct {
		name string
		msgs func(t *testing.T) []raw
		want []string
	}{
		{"rebuilt as it was", func(*testing.T) []raw { return original }, nil},
		{"truncated", func(*testing.T) []raw { return original[:2] }, []string{`tenant "acme": 1 entries, anchored with 2 entries`}},
		{"tenant removed", func(*testing.T) []raw { return []raw{original[0], original[2], original[3]} },
			[]string{`tenant "globex": anchored with 1 entries to seq 2`, "absent from the ledger", `tenant "acme": entry 2 is at seq 2`}},
		{"recomputed without the key", func(t *testing.T) []raw {
			return []raw{original[0], original[1], unkeyedEdit(t, es, 2), original[3]}
		}, []string{"an unkeyed entry after a keyed one", `tenant "acme": entry 2 has hash`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := rebuild(t, tt.msgs(t))
			r := ledger.Check(got, ledger.VerifyOptions{Secret: testSecret, Heads: heads})
			var all []string
			for _, f := range r.Findings {
				all = append(all, f.Error())
			}
			text := strings.Join(all, "\n")
			if len(tt.want) == 0 && r.Err() != nil {
				t.Fatalf("untampered: %v", r.Err())
			}
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("findings do not mention %q:\n%s", w, text)
				}
			}
		})
	}
}

// TestCheckRotatedSecret: a ledger keyed under otherSecret, then under testSecret from its
// fifth entry on (a rotation at 10:00:03), verifies with the new secret and the retired one;
// each way of signing with the retired secret after its retirement is a finding, as is an old
// entry checked without the retired secret. A heads file verifies under the secret that was
// current when it was written.
func TestCheckRotatedSecret(t *testing.T) {
	until := time.Date(2026, 3, 1, 10, 0, 3, 0, time.UTC)
	retired := []ledger.RetiredSecret{{Secret: otherSecret, Until: until}}
	rotated := func(t *testing.T) []ledger.Entry {
		es := readGolden(t, "clean", ledger.FormatJSONL)
		for _, tenant := range []string{"acme", "globex"} {
			es = ledgerkit.Rechain(es, tenant, 0, otherSecret)
			es = ledgerkit.Rechain(es, tenant, 4, testSecret)
		}
		if es[3].Time != until || !es[4].Time.After(until) {
			t.Fatalf("the golden ledger's times moved: entry 3 at %s, entry 4 at %s", es[3].Time, es[4].Time)
		}
		return es
	}
	tests := []struct {
		name   string
		ledger func(t *testing.T) []ledger.Entry
		opts   ledger.VerifyOptions
		want   []string // the findings' texts, in order (none: it verifies)
	}{
		{name: "both secrets", ledger: rotated, opts: ledger.VerifyOptions{Secret: testSecret, Retired: retired}},
		{name: "the new secret only", ledger: rotated, opts: ledger.VerifyOptions{Secret: testSecret},
			want: []string{`seq 1`, "keyed hash mismatch", `seq 2`, "keyed hash mismatch"}},
		{name: "an entry under the retired secret dated after its retirement", ledger: rotated,
			opts: ledger.VerifyOptions{Secret: testSecret, Retired: []ledger.RetiredSecret{{Secret: otherSecret, Until: until.Add(-time.Second)}}},
			want: []string{`seq 4`, "retired at 2026-03-01T10:00:02Z, and dated after it"}},
		{name: "a dormant tenant's entry signed with the retired secret later", ledger: func(t *testing.T) []ledger.Entry {
			es := rotated(t)
			return ledgerkit.Rechain(es, "globex", 0, otherSecret) // globex's entry of 10:00:06 under the old secret
		}, opts: ledger.VerifyOptions{Secret: testSecret, Retired: retired},
			want: []string{`seq 7`, "retired at 2026-03-01T10:00:03Z, and dated after it"}},
		{name: "appended under the retired secret, backdated", ledger: func(t *testing.T) []ledger.Entry {
			es := rotated(t)
			last := es[lastOf(es, "acme")]
			forged := last
			forged.ID, forged.Seq, forged.PrevHash, forged.Time = "forged-1", last.Seq+1, last.Hash, until.Add(-time.Second)
			forged.Hash = ledger.KeyedHashOf(otherSecret, &forged)
			return append(es, forged)
		}, opts: ledger.VerifyOptions{Secret: testSecret, Retired: retired},
			want: []string{`seq 10`, "older secret than the tenant's previous entry"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ledger.Check(tc.ledger(t), tc.opts)
			var got []string
			for _, f := range r.Findings {
				got = append(got, f.Error())
			}
			if len(tc.want) == 0 {
				if len(got) > 0 || r.Err() != nil || r.Keyed != 9 {
					t.Fatalf("findings %q, err %v, %d keyed; want none, all 9 keyed", got, r.Err(), r.Keyed)
				}
				return
			}
			if len(got) != len(tc.want)/2 {
				t.Fatalf("findings %q, want %d", got, len(tc.want)/2)
			}
			for i, f := range got {
				if !strings.Contains(f, tc.want[2*i]) || !strings.Contains(f, tc.want[2*i+1]) {
					t.Errorf("finding %d: %q, want it to say %q and %q", i, f, tc.want[2*i], tc.want[2*i+1])
				}
			}
		})
	}

	t.Run("heads", func(t *testing.T) {
		es := rotated(t)
		r := ledger.Check(es, ledger.VerifyOptions{Secret: testSecret, Retired: retired})
		for _, tc := range []struct {
			name    string
			created time.Time
			wantMAC string
			finding string
		}{
			{"signed before the retirement", until, ledger.MACValid, ""},
			{"signed after the retirement", until.Add(time.Second), "", "signed with a retired secret"},
		} {
			h := ledger.NewHeads(r.Heads, tc.created, otherSecret)
			got := ledger.Check(es, ledger.VerifyOptions{Secret: testSecret, Retired: retired, Heads: h})
			err := got.Err()
			if got.HeadsMAC != tc.wantMAC || (tc.finding == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.finding)) {
				t.Errorf("%s: heads MAC %q, err %v; want %q, finding %q", tc.name, got.HeadsMAC, err, tc.wantMAC, tc.finding)
			}
		}
	})
}
