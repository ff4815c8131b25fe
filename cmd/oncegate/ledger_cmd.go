package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/ledger"
)

const ledgerUsage = `usage:
  oncegate ledger verify [FILE|-] [--format csv|jsonl]
      verify an export (the format follows the file name, else --format; default jsonl);
      without FILE, verify the live LEDGER stream (needs --nats-url or --data-dir)
  oncegate ledger export [--format csv|jsonl] [--tenant T] [--from RFC3339] [--to RFC3339]
      write every entry (with hash and prev_hash) to stdout; verify needs an export of all entries
  oncegate ledger bill [--tenant T] [--from RFC3339] [--to RFC3339] [--json]
      gross, reversals and net by model (no --tenant: every tenant together), and the
      successful calls (completed charges plus executions avoided: joined and replayed), the
      money saved, the cost per successful call and the duplicate ratio; in JSON an open
      bound is null, and first_entry/last_entry are the times of the entries counted
  oncegate ledger reconcile [--dry-run] [--provider-usage FILE [--usage-format csv|jsonl]] [--json]
      reverse charges that bill one intent twice; match a provider's usage export
      (request_id, model, input_tokens, output_tokens, cost_micros) against the ledger.
      Exit status 3 when a provider line matches no intent (UNEXPLAINED), for cron to alert

  Every command but "verify FILE" reads the ledger through NATS:
    --nats-url URL   a running NATS (env ONCEGATE_NATS_URL), e.g. the gateway's --nats-listen
    --data-dir DIR   start the embedded NATS server read-write on the gateway's data directory;
                     the gateway must NOT be running on DIR at the same time (stop it first, or
                     use --nats-url against its --nats-listen address)

  Exit status: 0 done, 1 failed, 2 bad usage, 3 reconcile found unexplained provider usage.
`

// exitUnexplained is the exit status of `ledger reconcile --provider-usage` when a provider
// line matches no intent: the report is printed as usual, and cron can alert on the status.
const exitUnexplained = 3

// errUnexplained is returned by ledgerReconcile, after its report, when provider usage lines
// match no intent.
var errUnexplained = errors.New("provider usage lines match no intent")

// ledgerMain is `oncegate ledger …`.
func ledgerMain(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, ledgerUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("ledger "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, ledgerUsage) }
	lc := &ledgerConn{getenv: getenv}
	fs.StringVar(&lc.natsURL, "nats-url", "", "NATS URL (env ONCEGATE_NATS_URL)")
	fs.StringVar(&lc.dataDir, "data-dir", "", "gateway data directory: start the embedded server on it (gateway stopped)")
	format := fs.String("format", "", "export format: csv or jsonl")
	tenant := fs.String("tenant", "", "tenant id (default: every tenant)")
	fromS := fs.String("from", "", "start of the period, RFC 3339, inclusive")
	toS := fs.String("to", "", "end of the period, RFC 3339, exclusive")
	asJSON := fs.Bool("json", false, "print JSON")
	dryRun := fs.Bool("dry-run", false, "reconcile: report what would be reversed, append nothing")
	usagePath := fs.String("provider-usage", "", "reconcile: a provider usage export to match")
	usageFormat := fs.String("usage-format", "", "format of --provider-usage: csv or jsonl (default: from the file name)")
	// Flags may come before or after the positional argument (verify FILE --format csv).
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
	from, err1 := parseTimeFlag("from", *fromS)
	to, err2 := parseTimeFlag("to", *toS)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintf(stderr, "oncegate ledger %s: %v\n", sub, err)
		return 2
	}
	wantArgs := 0
	if sub == "verify" {
		wantArgs = 1
	}
	if len(rest) > wantArgs {
		fmt.Fprintf(stderr, "oncegate ledger %s: unexpected argument %q\n", sub, rest[wantArgs])
		return 2
	}
	switch sub {
	case "verify":
		if len(rest) == 1 {
			return ledgerVerifyFile(rest[0], *format, stdout, stderr)
		}
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Ledger) error {
			es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
			if err != nil {
				return err
			}
			return reportVerify("LEDGER stream", es, stdout)
		})
	case "export":
		f := *format
		if f == "" {
			f = ledger.FormatJSONL
		}
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Ledger) error {
			ew, err := ledger.NewExportWriter(stdout, f)
			if err != nil {
				return err
			}
			if err := l.Scan(ctx, *tenant, from, to, ew.Write); err != nil {
				return err
			}
			return ew.Flush()
		})
	case "bill":
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Ledger) error {
			b, err := l.Bill(ctx, *tenant, from, to)
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(stdout, b)
			}
			printBill(stdout, b)
			return nil
		})
	case "reconcile":
		var uf string
		if *usagePath != "" {
			uf = formatOf(*usagePath, *usageFormat)
		}
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Ledger) error {
			return ledgerReconcile(ctx, l, *dryRun, *usagePath, uf, *asJSON, stdout)
		})
	}
	fmt.Fprintf(stderr, "oncegate ledger: unknown command %q\n%s", sub, ledgerUsage)
	return 2
}

func parseTimeFlag(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s: want RFC 3339 (2026-03-01T00:00:00Z): %w", name, err)
	}
	return t, nil
}

// formatOf is explicit, else the file's extension, else jsonl.
func formatOf(path, explicit string) string {
	if explicit != "" {
		return explicit
	}
	if strings.EqualFold(filepath.Ext(path), ".csv") {
		return ledger.FormatCSV
	}
	return ledger.FormatJSONL
}

func ledgerVerifyFile(path, format string, stdout, stderr io.Writer) int {
	var r io.Reader = os.Stdin
	name := "stdin"
	if path != "-" {
		f, err := os.Open(path) // #nosec G703 -- the file the operator names on the command line
		if err != nil {
			fmt.Fprintf(stderr, "oncegate ledger verify: %v\n", err)
			return 1
		}
		defer f.Close()
		r, name = f, path
	}
	es, err := ledger.ReadExport(r, formatOf(path, format))
	if err != nil {
		fmt.Fprintf(stderr, "oncegate ledger verify: %s: %v\n", name, err)
		return 1
	}
	if err := reportVerify(name, es, stdout); err != nil {
		fmt.Fprintf(stderr, "oncegate ledger verify: %s: %v\n", name, err)
		return 1
	}
	return 0
}

// reportVerify verifies es and prints each tenant's head: compare them with the live stream
// to detect entries cut from the end of a chain, which no hash chain shows by itself.
func reportVerify(name string, es []ledger.Entry, w io.Writer) error {
	if err := ledger.Verify(es); err != nil {
		return err
	}
	type head struct {
		n    int
		hash string
		seq  uint64
	}
	heads := map[string]*head{}
	var order []string
	for _, e := range es {
		h := heads[e.Tenant]
		if h == nil {
			h = &head{}
			heads[e.Tenant] = h
			order = append(order, e.Tenant)
		}
		h.n++
		h.hash, h.seq = e.Hash, e.Seq
	}
	fmt.Fprintf(w, "%s: chain intact: %d entries, %d tenants\n", name, len(es), len(order))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "tenant\tentries\tlast seq\thead hash")
	for _, t := range order {
		h := heads[t]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", t, h.n, h.seq, h.hash)
	}
	return tw.Flush()
}

func ledgerReconcile(ctx context.Context, l *ledger.Ledger, dryRun bool, usagePath, usageFormat string, asJSON bool, w io.Writer) error {
	out := struct {
		DryRun    bool                     `json:"dry_run"`
		Currency  string                   `json:"currency"`
		Reconcile *ledger.ReconcileReport  `json:"reconcile,omitempty"`
		Planned   []ledger.PlannedReversal `json:"planned,omitempty"`
		Dups      []ledger.Duplicate       `json:"duplicates,omitempty"`
		Provider  *ledger.ProviderReport   `json:"provider,omitempty"`
	}{DryRun: dryRun}
	var entries []ledger.Entry
	var err error
	if dryRun {
		if entries, err = l.Entries(ctx, "", time.Time{}, time.Time{}); err != nil {
			return err
		}
		if out.Planned, out.Dups, err = ledger.PlanReconcile(entries); err != nil {
			return err
		}
	} else {
		rep, err := l.Reconcile(ctx)
		if err != nil {
			return err
		}
		out.Reconcile, out.Dups = &rep, rep.Duplicates
	}
	if usagePath != "" {
		if entries == nil {
			if entries, err = l.Entries(ctx, "", time.Time{}, time.Time{}); err != nil {
				return err
			}
		}
		f, err := os.Open(usagePath) // #nosec G703 -- the file the operator names on the command line
		if err != nil {
			return err
		}
		defer f.Close()
		pr, err := ledger.MatchProviderUsage(entries, f, usageFormat)
		if err != nil {
			return err
		}
		out.Provider = &pr
	}
	out.Currency = l.Currency()
	if len(entries) > 0 {
		out.Currency = entries[0].Currency
	}
	if asJSON {
		if err := writeJSON(w, out); err != nil {
			return err
		}
		return unexplained(out.Provider)
	}
	m := ledger.FormatMicros
	if dryRun {
		fmt.Fprintf(w, "dry run: %d intents charged more than once; %d reversals would be appended\n", len(out.Dups), len(out.Planned))
		for _, p := range out.Planned {
			fmt.Fprintf(w, "  would reverse %s (%s %s): %s\n", p.Of.ID, m(p.Of.CostMicros), out.Currency, p.Reason)
		}
	} else {
		rep := out.Reconcile
		fmt.Fprintf(w, "reconciled %d entries, %d intents: %d charged more than once; %d reversals appended (%s %s), %d already there\n",
			rep.Entries, rep.Intents, len(rep.Duplicates), len(rep.Appended), m(rep.ReversedMicros), out.Currency, rep.AlreadyThere)
		for _, r := range rep.Appended {
			fmt.Fprintf(w, "  reversed %s (%s %s): %s\n", r.Refers, m(r.CostMicros), out.Currency, r.Reason)
		}
	}
	if p := out.Provider; p != nil {
		fmt.Fprintf(w, "provider usage %s: %d lines, %s %s billed\n", usagePath, p.Lines, m(p.ProviderCostMicros), out.Currency)
		fmt.Fprintf(w, "  matched to standing charges: %d lines, %s\n", p.Matched, m(p.MatchedCostMicros))
		fmt.Fprintf(w, "  reversed (absorbed by the platform): %d lines, %s (ledger reversals total %s)\n",
			len(p.Reversed), m(p.ReversedCostMicros), m(p.LedgerReversedMicros))
		for _, r := range p.Reversed {
			fmt.Fprintf(w, "    line %d %s %s %d/%d %s -> %s\n", r.Line, r.RequestID, r.Model, r.InputTokens, r.OutputTokens, m(r.CostMicros), r.EntryID)
		}
		fmt.Fprintf(w, "  uncharged calls of known intents (absorbed): %d lines, %s\n", len(p.Uncharged), m(p.UnchargedCostMicros))
		for _, u := range p.Uncharged {
			fmt.Fprintf(w, "    line %d %s %s %d/%d %s\n", u.Line, u.RequestID, u.Model, u.InputTokens, u.OutputTokens, m(u.CostMicros))
		}
		fmt.Fprintf(w, "  UNEXPLAINED (no intent): %d lines, %s\n", len(p.Unexplained), m(p.UnexplainedCostMicros))
		for _, u := range p.Unexplained {
			fmt.Fprintf(w, "    line %d %s %s %d/%d %s\n", u.Line, u.RequestID, u.Model, u.InputTokens, u.OutputTokens, m(u.CostMicros))
		}
	}
	return unexplained(out.Provider)
}

// unexplained is errUnexplained (with the count) when p has lines that match no intent.
func unexplained(p *ledger.ProviderReport) error {
	if p == nil || len(p.Unexplained) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d lines, %s (exit %d)", errUnexplained, len(p.Unexplained), ledger.FormatMicros(p.UnexplainedCostMicros), exitUnexplained)
}

func printBill(w io.Writer, b *ledger.Bill) {
	tenant := b.Tenant
	if tenant == "" {
		tenant = "(every tenant)"
	}
	span := func(t time.Time, open string) string {
		if t.IsZero() {
			return open
		}
		return t.UTC().Format(time.RFC3339)
	}
	m := ledger.FormatMicros
	fmt.Fprintf(w, "bill for %s from %s to %s, in %s\n", tenant, span(b.From, "the beginning"), span(b.To, "now"), b.Currency)
	if !b.FirstEntry.IsZero() {
		fmt.Fprintf(w, "entries from %s to %s\n", span(b.FirstEntry, ""), span(b.LastEntry, ""))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\tcharges\tcontinuations\treversals\tinput tokens\toutput tokens\tgross\treversed\tnet\t")
	for _, l := range b.ByModel {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", l.Model, l.Charges, l.Continuations, l.Reversals,
			l.InputTokens, l.OutputTokens, m(l.GrossMicros), m(l.ReversedMicros), m(l.NetMicros))
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%d\t\t\t%s\t%s\t%s\t\n", b.Charges, b.Continuations, b.Reversals,
		m(b.GrossMicros), m(b.ReversedMicros), m(b.NetMicros))
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\tsuccessful calls\tcompleted\tavoided\tjoined\treplayed\tsaved\tcost per call\tduplicates\t")
	calls := func(name string, c *ledger.Calls) {
		perCall, dup := "-", "-" // no successful call: no ratio
		if c.SuccessfulCalls > 0 {
			perCall, dup = m(c.CostPerSuccessfulCallMicros), fmt.Sprintf("%.1f%%", 100*c.DuplicateRatio)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", name, c.SuccessfulCalls, c.CompletedCharges, c.ExecutionsAvoided,
			c.Joined, c.Replayed, m(c.SavedMicros), perCall, dup)
	}
	for i := range b.ByModel {
		calls(b.ByModel[i].Model, &b.ByModel[i].Calls)
	}
	calls("total", &b.Calls)
	_ = tw.Flush()
	fmt.Fprintln(w, "avoided: copies that joined a live execution or replayed a stored answer (a gateway crash loses at most its last ledger.tally_every of them)")
	if b.Estimated > 0 {
		fmt.Fprintf(w, "%d charges with estimated tokens (the backend reported no usage)\n", b.Estimated)
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ledgerConn reaches NATS for a ledger command: an external URL or the embedded server on the
// gateway's data directory.
type ledgerConn struct {
	natsURL, dataDir string
	getenv           func(string) string
}

// run connects, calls fn with a Ledger, disconnects, and returns the exit code.
func (lc *ledgerConn) run(ctx context.Context, sub string, stderr io.Writer, fn func(context.Context, *ledger.Ledger) error) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "oncegate ledger %s: %v\n", sub, err)
		return 1
	}
	url := lc.natsURL
	if url == "" && lc.dataDir == "" && lc.getenv != nil {
		url = lc.getenv("ONCEGATE_NATS_URL")
	}
	var nc *nats.Conn
	var err error
	switch {
	case url != "" && lc.dataDir != "":
		fmt.Fprintf(stderr, "oncegate ledger %s: give --nats-url or --data-dir, not both\n", sub)
		return 2
	case url != "":
		if nc, err = natsrv.ConnectURL(url, "oncegate-ledger-cli"); err != nil {
			return fail(err)
		}
	case lc.dataDir != "":
		storeDir := filepath.Join(lc.dataDir, "jetstream") // where `oncegate serve --data-dir` keeps it
		if _, err := os.Stat(storeDir); err != nil {
			return fail(fmt.Errorf("no gateway data in %s: %w", lc.dataDir, err))
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ns, err := natsrv.Start(sctx, natsrv.Options{StoreDir: storeDir, ServerName: "oncegate-ledger-cli"})
		cancel()
		if err != nil {
			return fail(err)
		}
		defer ns.Shutdown()
		if nc, err = ns.Connect("oncegate-ledger-cli"); err != nil {
			return fail(err)
		}
	default:
		fmt.Fprintf(stderr, "oncegate ledger %s: give --nats-url URL (or ONCEGATE_NATS_URL) or --data-dir DIR\n", sub)
		return 2
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	if sub == "reconcile" {
		if err := ledger.EnsureStream(ctx, js); err != nil {
			return fail(err)
		}
	}
	if err := fn(ctx, ledger.New(js, nil, "", ledger.WithLogger(newLogger(stderr, "warn")))); err != nil {
		if errors.Is(err, errUnexplained) {
			fmt.Fprintf(stderr, "oncegate ledger %s: %v\n", sub, err)
			return exitUnexplained
		}
		return fail(err)
	}
	return 0
}
