package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/oncegate/oncegate/dashboard"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// updateScreenshot rewrites docs/dashboard.png from TestDashboardShowsTheLiveExecution.
var updateScreenshot = flag.Bool("dashboard.screenshot", false, "write docs/dashboard.png from the dashboard browser test")

// browser starts headless Chromium (Debian's chromium) and returns a tab's context, closed
// (and the browser stopped) when the test ends. Without chromium the test skips, unless
// ONCEGATE_REQUIRE_TOOLS=1 (as CI sets it), where a missing binary fails it.
func browser(t *testing.T) context.Context {
	t.Helper()
	var bin string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		if os.Getenv("ONCEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatal("chromium is required (ONCEGATE_REQUIRE_TOOLS=1)")
		}
		t.Skip("chromium not installed (apt-get install chromium; set ONCEGATE_REQUIRE_TOOLS=1 to make this a failure)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1100), chromedp.Flag("disable-dev-shm-usage", true))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // start the browser now: its errors are the test's
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// tab opens another tab of ctx's browser (a fresh sessionStorage: a viewer of its own).
func tab(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	tctx, cancel := chromedp.NewContext(ctx)
	t.Cleanup(cancel)
	return tctx
}

// waitJS polls expr (a JavaScript expression) in the page until it is true, or fails the test
// after timeout saying what was awaited and what the page showed.
func waitJS(t *testing.T, ctx context.Context, timeout time.Duration, what, expr string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := chromedp.Run(wctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		shown, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("main") ? document.querySelector("main").innerText : ""`))
		t.Fatalf("dashboard: %s: %v\nthe page shows:\n%s", what, err, shown)
	}
}

// text is the text of the element sel.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("reading %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// counter is the number the element sel shows.
func counter(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	s := strings.ReplaceAll(text(t, ctx, sel), ",", "")
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s shows %q, not a number", sel, s)
	}
	return n
}

// pricedConfig is the test gateway's config with prices for the slow mock, so spend and
// savings are not zero.
func pricedConfig(t *testing.T) *config.Config {
	cfg := gatewaykit.Config(t)
	cfg.Ledger.Prices = map[string]config.Price{slowModel: {InputPerMillion: 2_000_000, OutputPerMillion: 8_000_000}}
	return cfg
}

// slowStream is a streamed chat body on the slow mock that runs about tokens × 150 ms.
func slowStream(msg string, tokens int) string {
	return chatBody(slowModel, msg, fmt.Sprintf(`"stream":true,"mock":{"inter_token_ms":150,"tokens":%d}`, tokens))
}

// live is a started stream: its job id and outcome (from the headers), and its end.
type live struct {
	job, outcome string
	done         chan error
}

// startStream posts body and returns once the response headers arrived; the body is read
// to its end in the background.
func startStream(t *testing.T, url, body string, hdr map[string]string) live {
	t.Helper()
	resp, err := openStream(http.MethodPost, url+chatPath, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream: status %d: %s", resp.StatusCode, b)
	}
	l := live{job: resp.Header.Get("Oncegate-Job-Id"), outcome: resp.Header.Get("Oncegate-Idempotency"), done: make(chan error, 1)}
	go func() {
		defer resp.Body.Close()
		_, err := io.Copy(io.Discard, resp.Body)
		l.done <- err
	}()
	return l
}

// joinFive starts an execution with key and five copies joined to it, and returns the
// creator's and the copies' streams.
func joinFive(t *testing.T, url, body, key string, hdr map[string]string) (live, []live) {
	t.Helper()
	h := map[string]string{"Idempotency-Key": key}
	for k, v := range hdr {
		h[k] = v
	}
	creator := startStream(t, url, body, h)
	if creator.outcome != "created" {
		t.Fatalf("first copy: %s, want created", creator.outcome)
	}
	copies := make([]live, 5)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() { copies[i] = startStream(t, url, body, h) })
	}
	wg.Wait()
	for i, c := range copies {
		if c.outcome != "joined" || c.job != creator.job {
			t.Fatalf("copy %d: %s of job %s, want joined to %s", i, c.outcome, c.job, creator.job)
		}
	}
	return creator, copies
}

func waitStreams(t *testing.T, ls ...live) {
	t.Helper()
	for _, l := range ls {
		select {
		case err := <-l.done:
			if err != nil {
				t.Fatalf("stream of %s: %v", l.job, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("stream of %s did not end", l.job)
		}
	}
}

// TestDashboardShowsTheLiveExecution opens the dashboard in headless Chromium on a real
// gateway (embedded NATS, mock backend, 127.0.0.1), drives a slow stream with 5 copies
// joined and then one replay, and reads the rendered page: the live execution shows 5
// followers (the joined copies; the creator is not counted) and joined is up by 5 while it
// still runs, a click on it opens its live
// transcript, the outcome counters move by exactly +1 created, +5 joined, +1 replayed (and
// nothing else), executions avoided shows 6, and all of it arrived without a reload.
func TestDashboardShowsTheLiveExecution(t *testing.T) {
	gw := gatewaykit.StartGateway(t, pricedConfig(t))
	ctx := browser(t) // closed before the gateway stops

	if err := chromedp.Do(ctx, chromedp.Navigate(gw.URL+"/")); err != nil {
		t.Fatal(err)
	}
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if loc != gw.URL+"/dashboard" {
		t.Fatalf("/ led to %s, want %s/dashboard", loc, gw.URL)
	}
	waitJS(t, ctx, 10*time.Second, "a first view", `document.body.dataset.updates >= 1`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.sameDocument = "yes"`)); err != nil {
		t.Fatal(err)
	}
	before := map[string]int{}
	for _, o := range []string{"created", "joined", "replayed", "bypassed", "conflict"} {
		before[o] = counter(t, ctx, "#outcome-"+o)
	}
	updates0, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Number(document.body.dataset.updates)`))
	if err != nil {
		t.Fatal(err)
	}

	body := slowStream("dashboard live", 30) // ≈4.5 s
	creator, copies := joinFive(t, gw.URL, body, "dash-live-1", nil)
	row := fmt.Sprintf(`#executions tr[data-job=%q]`, creator.job)
	waitJS(t, ctx, 10*time.Second, "the live execution with 5 followers",
		fmt.Sprintf(`(r => r && r.querySelector("td.followers").textContent === "5")(document.querySelector(%q))`, row))
	waitJS(t, ctx, 10*time.Second, "joined +5 while the execution runs", fmt.Sprintf(
		`document.getElementById("outcome-joined").textContent === "%d" && document.querySelector(%q) !== null`, before["joined"]+5, row))
	if got := text(t, ctx, row+" td:nth-child(3)"); got != slowModel {
		t.Errorf("the execution's model shows %q, want %s", got, slowModel)
	}
	waitJS(t, ctx, 5*time.Second, "tokens so far moving", fmt.Sprintf(`Number(document.querySelector(%q).textContent) > 0`, row+" td.tokens"))
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 5*time.Second, "the clicked execution's live transcript", `document.getElementById("transcript-text").textContent.length > 0`)

	waitStreams(t, append(copies, creator)...)
	rep := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "dash-live-1"})
	expect(t, rep, http.StatusOK, "replayed")

	want := map[string]int{"created": 1, "joined": 5, "replayed": 1, "bypassed": 0, "conflict": 0}
	var conds []string
	for o, d := range want {
		conds = append(conds, fmt.Sprintf(`document.getElementById("outcome-%s").textContent === "%d"`, o, before[o]+d))
	}
	waitJS(t, ctx, 10*time.Second, "the outcome counters moved by +1 created, +5 joined, +1 replayed", strings.Join(conds, " && "))
	waitJS(t, ctx, 10*time.Second, "executions avoided 6", `document.getElementById("avoided").textContent === "6"`)
	waitJS(t, ctx, 10*time.Second, "the execution gone from the in-flight table", fmt.Sprintf(`document.querySelector(%q) === null`, row))

	same, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.sameDocument || "reloaded"`))
	if err != nil {
		t.Fatal(err)
	}
	updates, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Number(document.body.dataset.updates)`))
	if err != nil {
		t.Fatal(err)
	}
	if same != "yes" || updates <= updates0 {
		t.Fatalf("the page was reloaded (%s) or not updated (%d views, %d before)", same, updates, updates0)
	}

	if *updateScreenshot {
		screenshot(t, ctx, gw)
	}
}

// screenshot writes docs/dashboard.png with a second execution live (5 copies joined) after
// the first round's counters and 30 s of light traffic (a new intent and a replay of it
// every 250 ms), so that the charts have lines.
func screenshot(t *testing.T, ctx context.Context, gw *gatewaykit.Gateway) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#transcript-close"))); err != nil {
		t.Fatal(err)
	}
	for i, end := 0, time.Now().Add(30*time.Second); time.Now().Before(end); i++ {
		h := map[string]string{"Idempotency-Key": fmt.Sprintf("dash-shot-traffic-%d", i)}
		body := mockBody(fmt.Sprintf("traffic %d", i), "", "")
		expect(t, postChat(t, gw.URL, body, h), http.StatusOK, "created")
		expect(t, postChat(t, gw.URL, body, h), http.StatusOK, "replayed")
		time.Sleep(250 * time.Millisecond) // a picture's pace, not a synchronization
	}
	creator, copies := joinFive(t, gw.URL, slowStream("dashboard screenshot", 40), "dash-shot", nil)
	other := startStream(t, gw.URL, slowStream("another intent", 40), nil)
	waitJS(t, ctx, 10*time.Second, "two live executions", `document.querySelectorAll("#executions tr[data-job]").length === 2`)
	time.Sleep(2 * time.Second) // let the charts and ages move for the picture
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "docs", "dashboard.png")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	waitStreams(t, append(copies, creator, other)...)
}

// TestDashboardTenantSeesItsOwnRows: with tenants configured, a tenant's key entered in the
// page shows that tenant's executions and money only, never another tenant's job, while an
// admin key sees both; the key never appears in a URL, and the tenant cannot open the other
// tenant's transcript.
func TestDashboardTenantSeesItsOwnRows(t *testing.T) {
	cfg := pricedConfig(t)
	cfg.Tenants = []config.Tenant{{ID: "acme", APIKeysSHA256: []string{sha("sk-acme")}}, {ID: "globex", APIKeysSHA256: []string{sha("sk-globex")}}}
	cfg.Admin.APIKeysSHA256 = []string{sha("sk-admin")}
	gw := gatewaykit.StartGateway(t, cfg)
	ctx := browser(t) // closed before the gateway stops

	acme := startStream(t, gw.URL, slowStream("acme's intent", 30), map[string]string{"Authorization": "Bearer sk-acme"})
	globex := startStream(t, gw.URL, slowStream("globex's intent", 30), map[string]string{"Authorization": "Bearer sk-globex"})

	open := func(ctx context.Context, key string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Navigate(gw.URL+"/dashboard")); err != nil {
			t.Fatal(err)
		}
		waitJS(t, ctx, 10*time.Second, "the key form", `document.getElementById("keybox").classList.contains("show")`)
		if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#key-input"), key+"\r")); err != nil {
			t.Fatal(err)
		}
	}
	rowOf := func(job string) string {
		return fmt.Sprintf(`document.querySelector('#executions tr[data-job=%q]')`, job)
	}

	admin := tab(t, ctx)
	open(admin, "sk-admin")
	waitJS(t, admin, 10*time.Second, "the admin sees both tenants' executions", rowOf(acme.job)+" && "+rowOf(globex.job))

	tenant := tab(t, ctx)
	open(tenant, "sk-acme")
	waitJS(t, tenant, 10*time.Second, "acme sees its execution", rowOf(acme.job)+` && document.getElementById("scope").textContent === "tenant acme"`)
	// Several views later, still nothing of globex's anywhere on the page.
	seen, err := chromedp.Run(tenant, chromedp.Evaluate[int](`Number(document.body.dataset.updates)`))
	if err != nil {
		t.Fatal(err)
	}
	waitJS(t, tenant, 10*time.Second, "three more views", fmt.Sprintf(`Number(document.body.dataset.updates) >= %d`, seen+3))
	html, err := chromedp.Run(tenant, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		t.Fatal(err)
	}
	href, err := chromedp.Run(tenant, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	tenants, err := chromedp.Run(tenant, chromedp.Evaluate[[]string](`[...document.querySelectorAll("[data-tenant]")].map(e => e.dataset.tenant)`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(html, globex.job) || strings.Contains(html, "globex") {
		t.Errorf("acme's dashboard shows globex's rows (job %s)", globex.job)
	}
	for _, tn := range tenants {
		if tn != "acme" {
			t.Errorf("acme's dashboard has a row of tenant %q", tn)
		}
	}
	if len(tenants) == 0 {
		t.Error("acme's dashboard has no row at all")
	}
	if strings.Contains(href, "sk-") {
		t.Errorf("the key is in the URL: %s", href)
	}
	// The transcript of another tenant's job is the same 404 as an unknown job.
	r := do(t, http.MethodGet, gw.URL+"/dashboard/jobs/"+globex.job+"/events?tenant=globex", "", map[string]string{"Authorization": "Bearer sk-acme"})
	expectError(t, r, http.StatusNotFound, "not_found")
	r = do(t, http.MethodGet, gw.URL+"/dashboard/stream", "", nil)
	expectError(t, r, http.StatusUnauthorized, "missing_api_key")
	waitStreams(t, acme, globex)
}

// running reports whether v shows job in flight.
func running(v dashboard.View, job string) bool {
	for _, e := range v.Executions {
		if e.JobID == job {
			return true
		}
	}
	return false
}

// TestDashboardCountsAJoinWhenItAttaches: n copies of one slow stream (≈6 s) on a real
// gateway; the dashboard's stream shows joined up by n-1 in a view that still shows the
// execution in flight (a copy counts when it attaches, not when its answer ends), and once
// every stream ended and two more snapshots were posted, joined is still up by n-1 and created
// by 1: each copy counted once.
func TestDashboardCountsAJoinWhenItAttaches(t *testing.T) {
	gw := gatewaykit.StartGateway(t, gatewaykit.Config(t))
	vs := openViews(t, gw.URL)
	vs.until(t, "a first view", func(dashboard.View) bool { return true })
	before := vs.last.Outcomes

	const n = 5
	body := slowStream("joined when it attaches", 40)
	h := map[string]string{"Idempotency-Key": "dash-join-attach"}
	creator := startStream(t, gw.URL, body, h)
	copies := make([]live, n-1)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() { copies[i] = startStream(t, gw.URL, body, h) })
	}
	wg.Wait()
	for i, c := range copies {
		if c.outcome != "joined" || c.job != creator.job {
			t.Fatalf("copy %d: %s of job %s, want joined to %s", i, c.outcome, c.job, creator.job)
		}
	}
	const joined, created = 1, 0
	vs.until(t, fmt.Sprintf("joined +%d while job %s runs", n-1, creator.job), func(v dashboard.View) bool {
		return v.Outcomes[joined]-before[joined] == n-1 && running(v, creator.job)
	})
	for _, l := range append(copies, creator) {
		select {
		case <-l.done:
			t.Fatalf("a stream of job %s ended before the dashboard showed the joins", l.job)
		default:
		}
	}

	waitStreams(t, append(copies, creator)...)
	vs.until(t, "the execution gone", func(v dashboard.View) bool { return !running(v, creator.job) })
	settle := time.Now().Add(2 * dashboard.PostEvery)
	vs.until(t, "two more snapshots", func(v dashboard.View) bool {
		if got := v.Outcomes[joined] - before[joined]; got != n-1 {
			t.Fatalf("joined moved by %d after the streams ended, want %d: a copy was counted twice", got, n-1)
		}
		return time.Now().After(settle)
	})
	if got := vs.last.Outcomes[created] - before[created]; got != 1 {
		t.Errorf("created moved by %d, want 1", got)
	}
}

// TestDashboardHistoryAndRateTile: on a real gateway whose history already covers a rate
// window, 30 requests sent at once. A dashboard opened after them (headless Chromium) shows,
// from its first view, more points than any view carries (the history came first) whose
// created rates add up to the 30 requests; the created tile reads a rate that, times the
// window it states (about 10 s), is 30 requests; the charts have a value axis from 0/s with
// round ticks above the burst's point and clock-time ticks; and once the burst is older than
// the window, the tile reads 0.00/s.
func TestDashboardHistoryAndRateTile(t *testing.T) {
	gw := gatewaykit.StartGateway(t, gatewaykit.Config(t))
	ctx := browser(t) // closed before the gateway stops

	vs := openViews(t, gw.URL)
	window := dashboard.RateWindow.Seconds() - dashboard.HistoryEvery.Seconds()/2
	vs.until(t, "a history as long as the rate window", func(v dashboard.View) bool {
		return v.Rates != nil && v.Rates.Window >= window
	})

	const burst = 30
	var wg sync.WaitGroup
	results := make([]result, burst)
	for i := range results {
		wg.Go(func() {
			results[i] = send(http.MethodPost, gw.URL+chatPath, mockBody(fmt.Sprintf("burst %d", i), "", ""), nil)
		})
	}
	wg.Wait()
	for _, r := range results {
		expect(t, r, http.StatusOK, "created")
	}
	vs.until(t, "the burst in the rate window", func(v dashboard.View) bool {
		return v.Rates != nil && math.Abs(v.Rates.PerSecond[0]*v.Rates.Window-burst) < 0.01
	})

	if err := chromedp.Do(ctx, chromedp.Navigate(gw.URL+"/dashboard")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 10*time.Second, "a first view", `document.body.dataset.updates >= 1`)
	first, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Number(document.body.dataset.firstPoints)`))
	if err != nil {
		t.Fatal(err)
	}
	if first <= dashboard.RecentPoints {
		t.Errorf("the first view found %d points, want more than a view carries (%d): no history on open", first, dashboard.RecentPoints)
	}
	sum, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`(s => s.slice(1).reduce((a, p, i) => a + p.rates[0] * (p.t - s[i].t) / 1000, 0))(window.oncegateDashboard.series())`))
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(sum-burst) > 0.5 {
		t.Errorf("the created points add up to %.2f requests, want %d", sum, burst)
	}

	// The tile: a rate times its window is the burst (the tile rounds to 2 decimals).
	waitJS(t, ctx, 10*time.Second, "the created tile reading 30 requests over its window",
		`(r => r > 0 && Math.abs(r * parseFloat(document.getElementById("rate-window").textContent) - 30) < 0.5)(parseFloat(document.getElementById("rate-created").textContent))`)
	tile, win := text(t, ctx, "#rate-created"), text(t, ctx, "#rate-window")
	var rate, secs float64
	if _, err := fmt.Sscanf(tile, "%f/s", &rate); err != nil {
		t.Fatalf("the created tile shows %q", tile)
	}
	if _, err := fmt.Sscanf(win, "%f s", &secs); err != nil || secs < window || secs > dashboard.RateWindow.Seconds()+1 {
		t.Fatalf("the rate window shows %q, want about %v", win, dashboard.RateWindow)
	}
	t.Logf("created tile %s over %s", tile, win)

	// The axes.
	type axes struct {
		Y   []string `json:"y"`
		X   []string `json:"x"`
		Lat []string `json:"lat"`
		Max float64  `json:"max"`
	}
	ticks, err := chromedp.Run(ctx, chromedp.Evaluate[axes](`({
		y: [...document.querySelectorAll("#chart-outcomes text.tick-y")].map(e => e.textContent),
		x: [...document.querySelectorAll("#chart-outcomes text.tick-x")].map(e => e.textContent),
		lat: [...document.querySelectorAll("#chart-latency text.tick-y")].map(e => e.textContent),
		max: Math.max(...window.oncegateDashboard.series().map(p => p.rates[0])),
	})`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ticks.Y) < 2 || ticks.Y[0] != "0/s" {
		t.Fatalf("value axis ticks %q, want 0/s and more", ticks.Y)
	}
	var top float64
	if _, err := fmt.Sscanf(ticks.Y[len(ticks.Y)-1], "%f/s", &top); err != nil || top < ticks.Max || top > 2*ticks.Max {
		t.Errorf("value axis %q: its top tick is not just above the highest point (%.1f/s)", ticks.Y, ticks.Max)
	}
	if len(ticks.X) < 4 {
		t.Errorf("time axis ticks %q, want one every 3 minutes of the 15", ticks.X)
	}
	for _, x := range ticks.X {
		if len(x) != 5 || x[2] != ':' {
			t.Errorf("time axis tick %q, want HH:MM", x)
		}
	}
	if len(ticks.Lat) < 2 || !strings.HasSuffix(ticks.Lat[0], " ms") {
		t.Errorf("latency axis ticks %q, want labels in ms", ticks.Lat)
	}

	waitJS(t, ctx, 20*time.Second, "the created tile at 0 once the burst left the window",
		`document.getElementById("rate-created").textContent === "0.00/s"`)
}
