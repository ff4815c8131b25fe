package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/ledger"
)

const ledgerUsage = `usage:
  oncegate ledger verify [FILE|-|live] [--format csv|jsonl] [--heads FILE] [--require-keyed]
      verify an export (the format follows the file name, else --format; default jsonl);
      without FILE (or with "live"), verify the live ledger streams, every partition's
      (LEDGER, LEDGER_P1, ...; needs --nats-url or --data-dir). Each entry's hash (keyed
      entries' with the ledger secret) and its link to the previous entry of its tenant in its
      partition (a tenant has one chain per partition); with --heads, that every anchored
      chain is still there with its anchored entries (entries appended since are fine); with
      --require-keyed, that every entry is keyed. One line per finding; with several
      partitions, one line per partition of what was checked
  oncegate ledger head [--out FILE]
      export each tenant's head in each partition (tenant, partition, seq and hash of its
      last entry, count of entries, time) as JSON, with an HMAC over it when the ledger secret is set: keep it away from the
      ledger, and give it to verify --heads later. Refused when the chain does not verify
  oncegate ledger export [--format csv|jsonl] [--tenant T] [--from RFC3339] [--to RFC3339]
      write every entry (with hash and prev_hash) to stdout, partition after partition, each
      in its stream's order; verify needs an export of all entries
  oncegate ledger bill [--tenant T] [--from RFC3339] [--to RFC3339] [--json]
      gross, reversals and net by model (no --tenant: every tenant together), over every
      partition, and the
      successful calls (completed charges plus executions avoided: joined and replayed), the
      money saved, the cost per successful call and the duplicate ratio; in JSON an open
      bound is null, and first_entry/last_entry are the times of the entries counted
  oncegate ledger reconcile [--dry-run] [--provider-usage FILE [--usage-format csv|jsonl]] [--json]
      reverse charges that bill one intent twice, in every partition (an intent and its
      charges live in one); match a provider's usage export
      (request_id, model, input_tokens, output_tokens, cost_micros) against the ledger.
      Exit status 3 when a provider line matches no intent (UNEXPLAINED), for cron to alert

  Every command but "verify FILE" reads the ledger through NATS, every partition whose
  stream exists (LEDGER, LEDGER_P1, ...):
    --nats-url URL   a running NATS (env ONCEGATE_NATS_URL), e.g. the gateway's --nats-listen
    --data-dir DIR   start the embedded NATS server read-write on the gateway's data directory;
                     the gateway must NOT be running on DIR at the same time (stop it first, or
                     use --nats-url against its --nats-listen address)
  The ledger secret (verify, head) is ONCEGATE_LEDGER_SECRET, else ledger.secret of
  --config FILE; the secrets it replaced are that file's ledger.retired_secrets.

  Exit status: 0 done, 1 failed (verify: a finding), 2 bad usage, 3 reconcile found
  unexplained provider usage, 4 verify found nothing but could not check keyed entries or
  the heads' MAC without the ledger secret.
`

// exitUnexplained is the exit status of `ledger reconcile --provider-usage` when a provider
// line matches no intent: the report is printed as usual, and cron can alert on the status.
const exitUnexplained = 3

// exitUnchecked is the exit status of `ledger verify` when it found nothing wrong but keyed
// entries, or the heads file's MAC, could not be checked without the ledger secret.
const exitUnchecked = 4

// exitError is an error already reported to the user, with the exit status to return.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

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
	headsPath := fs.String("heads", "", "verify: the heads file (written by ledger head) to check the ledger against")
	requireKeyed := fs.Bool("require-keyed", false, "verify: every entry must be keyed (a ledger keyed from its first entry)")
	outPath := fs.String("out", "", "head: write the heads to FILE (default stdout)")
	configPath := fs.String("config", "", "verify, head: the gateway's config file, for ledger.secret")
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
	var keys ledger.VerifyOptions // the secret and the retired ones
	if sub == "verify" || sub == "head" {
		var err error
		if keys, err = ledgerKeys(*configPath, getenv); err != nil {
			fmt.Fprintf(stderr, "oncegate ledger %s: %v\n", sub, err)
			return 2
		}
	}
	switch sub {
	case "verify":
		opts := keys
		opts.RequireKeyed = *requireKeyed
		if *headsPath != "" {
			h, err := readHeadsFile(*headsPath)
			if err != nil {
				fmt.Fprintf(stderr, "oncegate ledger verify: %v\n", err)
				return 1
			}
			opts.Heads = h
		}
		v := verifyRun{opts: opts, headsName: *headsPath, stdout: stdout, stderr: stderr}
		if len(rest) == 1 && rest[0] != "live" {
			return v.file(rest[0], *format)
		}
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Set) error {
			es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
			if err != nil {
				return err
			}
			name := "LEDGER stream"
			if n := len(l.Ledgers()); n > 1 {
				name = fmt.Sprintf("ledger streams (%d partitions)", n)
			}
			if code := v.report(name, es); code != 0 {
				return &exitError{code}
			}
			return nil
		})
	case "head":
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Set) error {
			es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
			if err != nil {
				return err
			}
			return ledgerHead(es, keys, *outPath, stdout, stderr)
		})
	case "export":
		f := *format
		if f == "" {
			f = ledger.FormatJSONL
		}
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Set) error {
			ew, err := ledger.NewExportWriter(stdout, f)
			if err != nil {
				return err
			}
			var counts []string
			for _, pl := range l.Ledgers() {
				n := 0
				if err := pl.Scan(ctx, *tenant, from, to, func(e ledger.Entry) error { n++; return ew.Write(e) }); err != nil {
					return err
				}
				counts = append(counts, fmt.Sprintf("%s %d", pl.Stream(), n))
			}
			if len(counts) > 1 {
				fmt.Fprintf(stderr, "oncegate ledger export: entries by partition: %s\n", strings.Join(counts, ", "))
			}
			return ew.Flush()
		})
	case "bill":
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Set) error {
			b, err := l.Bill(ctx, *tenant, from, to)
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(stdout, b)
			}
			printBill(stdout, b)
			if n := len(l.Ledgers()); n > 1 {
				fmt.Fprintf(stdout, "read %d partitions: %s\n", n, streamsOf(l))
			}
			return nil
		})
	case "reconcile":
		var uf string
		if *usagePath != "" {
			uf = formatOf(*usagePath, *usageFormat)
		}
		return lc.run(ctx, sub, stderr, func(ctx context.Context, l *ledger.Set) error {
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

// ledgerKeys are the ledger secret — ONCEGATE_LEDGER_SECRET, else ledger.secret of the config
// file at path (which applies the environment too); none when neither is set — and the
// retired ones, ledger.retired_secrets of that file.
func ledgerKeys(path string, getenv func(string) string) (ledger.VerifyOptions, error) {
	var s string
	if getenv != nil {
		s = getenv(config.EnvLedgerSecret)
	}
	var keys ledger.VerifyOptions
	if path != "" {
		cfg, err := config.LoadWith(path, getenv)
		if err != nil {
			return keys, err
		}
		s = cmp.Or(s, cfg.Ledger.Secret)
		for _, r := range cfg.Ledger.RetiredSecrets {
			keys.Retired = append(keys.Retired, ledger.RetiredSecret{Secret: []byte(r.Secret), Until: r.Until.Time})
		}
	}
	if s == "" {
		if len(keys.Retired) > 0 {
			return keys, fmt.Errorf("ledger.retired_secrets without a ledger secret (%s or ledger.secret)", config.EnvLedgerSecret)
		}
		return keys, nil
	}
	if err := ledger.CheckSecret([]byte(s)); err != nil {
		return keys, fmt.Errorf("%s: %w", config.EnvLedgerSecret, err)
	}
	keys.Secret = []byte(s)
	return keys, nil
}

func readHeadsFile(path string) (*ledger.Heads, error) {
	f, err := os.Open(path) // #nosec G703 -- the --heads file the operator names on the command line
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h, err := ledger.ReadHeads(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// verifyRun is one `ledger verify`: its options and where it reports.
type verifyRun struct {
	opts           ledger.VerifyOptions
	headsName      string
	stdout, stderr io.Writer
}

func (v *verifyRun) file(path, format string) int {
	var r io.Reader = os.Stdin
	name := "stdin"
	if path != "-" {
		f, err := os.Open(path) // #nosec G703 -- the file the operator names on the command line
		if err != nil {
			fmt.Fprintf(v.stderr, "oncegate ledger verify: %v\n", err)
			return 1
		}
		defer f.Close()
		r, name = f, path
	}
	es, err := ledger.ReadExport(r, formatOf(path, format))
	if err != nil {
		fmt.Fprintf(v.stderr, "oncegate ledger verify: %s: %v\n", name, err)
		return 1
	}
	return v.report(name, es)
}

// report checks es and prints one line per finding on stderr (exit 1); else what was
// proved and each tenant's head on stdout, and, if keyed entries or the heads' MAC could not
// be checked without the secret, a line saying so on stderr (exit exitUnchecked).
func (v *verifyRun) report(name string, es []ledger.Entry) int {
	r := ledger.Check(es, v.opts)
	if len(r.Findings) > 0 {
		for _, f := range r.Findings {
			fmt.Fprintf(v.stderr, "oncegate ledger verify: %s: %v\n", name, f)
		}
		fmt.Fprintf(v.stderr, "oncegate ledger verify: %s: %d findings\n", name, len(r.Findings))
		return 1
	}
	w := v.stdout
	parts := byPartition(r.Heads)
	if r.Unchecked > 0 {
		fmt.Fprintf(w, "%s: chain links intact, %d keyed entries not checked: %d entries, %d tenants\n", name, r.Unchecked, len(es), tenantsOf(r.Heads))
	} else {
		fmt.Fprintf(w, "%s: chain intact: %d entries, %d tenants\n", name, len(es), tenantsOf(r.Heads))
	}
	if len(parts) > 1 {
		for _, p := range parts {
			fmt.Fprintf(w, "%s: partition %d (%s): %d entries, %d tenants' chains checked\n", name, p.part, partition.P(p.part).Stream(ledger.StreamName), p.entries, p.chains)
		}
	}
	if r.Keyed > 0 && r.Unchecked == 0 {
		fmt.Fprintf(w, "%s: %d keyed entries checked with the ledger secret, %d unkeyed\n", name, r.Keyed, r.Unkeyed)
	}
	if h := v.opts.Heads; h != nil {
		mac := map[string]string{ledger.MACValid: "its MAC checked", ledger.MACAbsent: "no MAC (written without a secret)",
			ledger.MACUnchecked: "its MAC NOT checked"}[r.HeadsMAC]
		fmt.Fprintf(w, "%s: matches the heads in %s (%s, %s): %d tenants anchored, %d entries appended since\n",
			name, v.headsName, h.Created.Format(time.RFC3339), mac, r.Anchored, r.After)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(parts) > 1 {
		fmt.Fprintln(tw, "tenant\tpartition\tentries\tlast seq\thead hash")
		for _, h := range r.Heads {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", h.Tenant, h.Partition, h.Count, h.Seq, h.Hash)
		}
	} else {
		fmt.Fprintln(tw, "tenant\tentries\tlast seq\thead hash")
		for _, h := range r.Heads {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", h.Tenant, h.Count, h.Seq, h.Hash)
		}
	}
	_ = tw.Flush()
	code := 0
	if r.Unchecked > 0 {
		fmt.Fprintf(v.stderr, "oncegate ledger verify: %s: cannot check %d keyed entries without the ledger secret (set %s, or --config FILE with ledger.secret): their links were checked, their contents were not\n",
			name, r.Unchecked, config.EnvLedgerSecret)
		code = exitUnchecked
	}
	if r.HeadsMAC == ledger.MACUnchecked {
		fmt.Fprintf(v.stderr, "oncegate ledger verify: %s: cannot check the MAC of %s without the ledger secret: the heads were used as they are\n",
			name, v.headsName)
		code = exitUnchecked
	}
	return code
}

// partCount is what verify checked of one partition: its entries and chains (one per tenant).
type partCount struct{ part, entries, chains int }

// byPartition sums heads by partition, in order.
func byPartition(heads []ledger.Head) []partCount {
	var out []partCount
	for _, h := range heads {
		i := slices.IndexFunc(out, func(p partCount) bool { return p.part == h.Partition })
		if i < 0 {
			out = append(out, partCount{part: h.Partition})
			i = len(out) - 1
		}
		out[i].entries += h.Count
		out[i].chains++
	}
	slices.SortFunc(out, func(a, b partCount) int { return cmp.Compare(a.part, b.part) })
	return out
}

// tenantsOf counts the tenants of heads (a tenant has a head in each partition it has entries in).
func tenantsOf(heads []ledger.Head) int {
	seen := map[string]bool{}
	for _, h := range heads {
		seen[h.Tenant] = true
	}
	return len(seen)
}

// streamsOf lists the streams of s's partitions.
func streamsOf(s *ledger.Set) string {
	names := make([]string, 0, len(s.Ledgers()))
	for _, l := range s.Ledgers() {
		names = append(names, l.Stream())
	}
	return strings.Join(names, ", ")
}

// ledgerHead anchors es: it writes each tenant's head to out (stdout when empty), with a MAC
// under keys.Secret when it is set. A chain that does not verify under keys is not anchored.
func ledgerHead(es []ledger.Entry, keys ledger.VerifyOptions, out string, stdout, stderr io.Writer) error {
	r := ledger.Check(es, keys)
	if len(r.Findings) > 0 {
		for _, f := range r.Findings {
			fmt.Fprintf(stderr, "oncegate ledger head: %v\n", f)
		}
		return fmt.Errorf("the chain does not verify (%d findings): not anchored", len(r.Findings))
	}
	if r.Unchecked > 0 {
		fmt.Fprintf(stderr, "oncegate ledger head: %d keyed entries not checked without the ledger secret (set %s); the heads are unsigned\n",
			r.Unchecked, config.EnvLedgerSecret)
	}
	h := ledger.NewHeads(r.Heads, time.Now(), keys.Secret)
	signed := "unsigned (no ledger secret)"
	if h.MAC != "" {
		signed = "with an HMAC"
	}
	if out == "" {
		if err := ledger.WriteHeads(stdout, h); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "oncegate ledger head: %d tenants, %d entries, %s\n", tenantsOf(h.Heads), len(es), signed)
		return nil
	}
	if err := writeFileAtomic(out, func(w io.Writer) error { return ledger.WriteHeads(w, h) }); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: heads of %d tenants, %d entries, %s\n", out, tenantsOf(h.Heads), len(es), signed)
	return nil
}

// writeFileAtomic writes path through a temporary file in its directory, renamed into place
// once complete and synced: a crash never leaves a half-written heads file.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, nothing
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path) // #nosec G703 -- the --out file the operator names on the command line
}

func ledgerReconcile(ctx context.Context, l *ledger.Set, dryRun bool, usagePath, usageFormat string, asJSON bool, w io.Writer) error {
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
		if ls := l.Ledgers(); len(ls) > 1 {
			for _, pl := range ls {
				n := 0
				for _, e := range entries {
					if partition.OfKey(e.KeyHash) == pl.Partition() {
						n++
					}
				}
				planned := 0
				for _, p := range out.Planned {
					if partition.OfKey(p.Of.KeyHash) == pl.Partition() {
						planned++
					}
				}
				fmt.Fprintf(w, "  partition %d (%s): %d entries read, %d reversals would be appended\n", pl.Partition(), pl.Stream(), n, planned)
			}
		}
	} else {
		rep := out.Reconcile
		fmt.Fprintf(w, "reconciled %d entries, %d intents: %d charged more than once; %d reversals appended (%s %s), %d already there\n",
			rep.Entries, rep.Intents, len(rep.Duplicates), len(rep.Appended), m(rep.ReversedMicros), out.Currency, rep.AlreadyThere)
		for _, r := range rep.Appended {
			fmt.Fprintf(w, "  reversed %s (%s %s): %s\n", r.Refers, m(r.CostMicros), out.Currency, r.Reason)
		}
		if len(rep.Partitions) > 1 {
			for _, p := range rep.Partitions {
				fmt.Fprintf(w, "  partition %d (%s): %d entries, %d intents, %d charged more than once, %d reversals appended, %d already there\n",
					p.Partition, partition.P(p.Partition).Stream(ledger.StreamName), p.Entries, p.Intents, len(p.Duplicates), len(p.Appended), p.AlreadyThere)
			}
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
func (lc *ledgerConn) run(ctx context.Context, sub string, stderr io.Writer, fn func(context.Context, *ledger.Set) error) int {
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
	set, err := ledger.OpenSet(ctx, js, nil, "", ledger.WithLogger(newLogger(stderr, "warn")))
	if err != nil {
		return fail(err)
	}
	if sub == "reconcile" {
		for _, l := range set.Ledgers() {
			if err := ledger.EnsurePartition(ctx, js, l.Partition(), 1, nil); err != nil {
				return fail(err)
			}
		}
	}
	if err := fn(ctx, set); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		if errors.Is(err, errUnexplained) {
			fmt.Fprintf(stderr, "oncegate ledger %s: %v\n", sub, err)
			return exitUnexplained
		}
		return fail(err)
	}
	return 0
}
