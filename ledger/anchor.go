package ledger

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/oncegate/oncegate/internal/partition"
)

// VerifyOptions say what Check verifies beyond the chain's own links and hashes.
type VerifyOptions struct {
	// Secret is the ledger's secret (ledger.secret): with it the hash of every keyed entry is
	// checked; without it a keyed entry's hash cannot be checked (Report.Unchecked), only its
	// link to its neighbours.
	Secret []byte
	// Retired are the secrets Secret replaced, oldest first (ledger.retired_secrets): an entry
	// keyed under one verifies if it is dated no later than its Until and its tenant's chain had
	// not moved on to a newer secret already; a heads file signed under one, if it was created
	// no later than its Until. So a retired secret that leaked cannot sign what comes after it.
	Retired []RetiredSecret
	// RequireKeyed makes an unkeyed entry a finding: for a ledger keyed from its first entry,
	// where an unkeyed chain can only be one recomputed without the secret.
	RequireKeyed bool
	// Heads are the anchored heads (`oncegate ledger head`): each tenant they name must still
	// be there with at least their count of entries, the entry at that count having their
	// hash. Entries appended after an anchored head are fine. Nil: no anchor.
	Heads *Heads
}

// RetiredSecret is a ledger secret no longer used for new entries: the entries and heads
// files dated up to Until were signed under it.
type RetiredSecret struct {
	Secret []byte
	Until  time.Time
}

// keys are the secrets Check verifies under, oldest first, the current one last with a zero
// Until; empty when there is no current secret (keyed entries are then not checked).
type keys []RetiredSecret

func newKeys(o VerifyOptions) keys {
	if len(o.Secret) == 0 {
		return nil
	}
	return append(slices.Clone(keys(o.Retired)), RetiredSecret{Secret: o.Secret})
}

// current is the secret new entries are keyed under.
func (k keys) current() []byte { return k[len(k)-1].Secret }

// signer is the index of the secret under which mac(secret) is stored, newest first; -1 if
// none. why is set when that secret is a retired one and at is after its Until.
func (k keys) signer(stored string, mac func(secret []byte) string, at time.Time) (i int, why string) {
	for i = len(k) - 1; i >= 0; i-- {
		if !hmac.Equal([]byte(stored), []byte(mac(k[i].Secret))) {
			continue
		}
		if i < len(k)-1 && at.After(k[i].Until) {
			why = fmt.Sprintf("retired at %s", k[i].Until.UTC().Format(time.RFC3339))
		}
		return i, why
	}
	return -1, ""
}

// entryGeneration is the index in k of the secret e's keyed hash matches, among those e may be
// keyed under: not older than from (the generation its chain's previous keyed entry had), a
// retired one only for an entry dated up to its Until. why says which rule a match broke; -1
// and why empty: no secret matches.
func (k keys) entryGeneration(e *Entry, from int) (gen int, why string) {
	i, retired := k.signer(e.Hash, func(secret []byte) string { return KeyedHashOf(secret, e) }, e.Time)
	switch {
	case retired != "":
		return -1, "keyed under a secret " + retired + ", and dated after it: signed with a retired secret"
	case i >= 0 && i < from:
		return -1, "keyed under an older secret than the tenant's previous entry: signed with a retired secret"
	}
	return i, ""
}

// Head is one tenant's chain head in one partition: its last entry's sequence, hash and time,
// and how many entries the chain has. Partition is 0 in a store of one partition (and then
// absent from a heads file's JSON, as in files written before partitions).
type Head struct {
	Tenant    string    `json:"tenant"`
	Partition int       `json:"partition,omitempty"`
	Seq       uint64    `json:"seq"`
	Count     int       `json:"count"`
	Hash      string    `json:"hash"`
	Time      time.Time `json:"time"`
}

// AnchorError is a finding of Check against anchored heads (Tenant empty: about the heads
// file itself). It matches ErrAnchor.
type AnchorError struct {
	Tenant    string
	Partition int
	Reason    string
}

func (e *AnchorError) Error() string {
	switch {
	case e.Tenant == "":
		return "ledger: heads: " + e.Reason
	case e.Partition != 0:
		return fmt.Sprintf("ledger: tenant %q in partition %d: %s", e.Tenant, e.Partition, e.Reason)
	}
	return fmt.Sprintf("ledger: tenant %q: %s", e.Tenant, e.Reason)
}

// chainOf names a chain: a tenant's entries in one partition (that of their key hash: an
// intent and all its entries live in the partition of its key).
type chainOf struct {
	tenant string
	part   int
}

// chainOfEntry is the chain e belongs to.
func chainOfEntry(e *Entry) chainOf { return chainOf{e.Tenant, int(partition.OfKey(e.KeyHash))} }

// Unwrap makes an AnchorError match ErrAnchor.
func (e *AnchorError) Unwrap() error { return ErrAnchor }

// Heads MAC states (Report.HeadsMAC).
const (
	MACValid     = "valid"     // the heads carry a MAC, and it matches under the secret
	MACAbsent    = "absent"    // the heads carry no MAC (written without a secret)
	MACUnchecked = "unchecked" // the heads carry a MAC, and no secret was given to check it
)

// Report is what Check found.
type Report struct {
	Entries int
	// Heads are the tenants' heads as read, in the order of their first entries.
	Heads []Head
	// Keyed and Unkeyed count the entries of each scheme; Unchecked the keyed entries whose
	// hash could not be checked (no secret).
	Keyed, Unkeyed, Unchecked int
	// Anchored counts the tenants whose anchored head was found; After the entries appended
	// after those heads. HeadsMAC is MACValid, MACAbsent or MACUnchecked (empty: no heads).
	Anchored, After int
	HeadsMAC        string
	// Findings are every problem found, in order: *ChainError (entries altered, removed,
	// inserted, reordered, recomputed without the key) and *AnchorError (truncation, a removed
	// tenant, a chain rewritten up to its anchor, a heads file altered).
	Findings []error
}

// Err is the first finding; else an ErrUnchecked when keyed entries or the heads' MAC could
// not be checked without the secret; else nil.
func (r *Report) Err() error {
	switch {
	case len(r.Findings) > 0:
		return r.Findings[0]
	case r.Unchecked > 0:
		return fmt.Errorf("%w: %d keyed entries' hashes (their links to their neighbours were checked)", ErrUnchecked, r.Unchecked)
	case r.HeadsMAC == MACUnchecked:
		return fmt.Errorf("%w: the heads file's MAC", ErrUnchecked)
	}
	return nil
}

// tenantState is Check's view of one tenant's chain.
type tenantState struct {
	head   Head
	broken bool // a finding was made: its later entries are not checked (one finding per tenant)
	keyed  bool // a keyed entry was seen
	gen    int  // the index in keys of the secret its last keyed entry matched
	// atAnchor is the hash and seq of the entry at the anchored count, once read.
	anchor      *Head
	atAnchor    string
	atAnchorSeq uint64
}

// Check verifies a complete export (every entry of each tenant it contains, in stream order)
// and, with o, its keyed hashes and its anchor. A tenant has one chain per partition (the
// partition of its entries' key hashes, partition.OfKey), checked apart; an export of several
// partitions holds each one's entries in its stream order (Set.Scan's order):
//
//   - each entry's hash: SHA-256 for an unkeyed entry; for a keyed one the HMAC under
//     o.Secret (without it, not checked: Report.Unchecked);
//   - that each entry's prev_hash is the hash of the previous entry of its tenant (none for a
//     tenant's first entry), that ids are unique, and that sequences, when present, increase;
//   - that no unkeyed entry follows a keyed one in a tenant's chain (with o.RequireKeyed, that
//     no entry is unkeyed): a chain recomputed without the secret is unkeyed from the edit on;
//   - with o.Heads, each anchored tenant: present, at least as long as anchored, with the
//     anchored hash (and, when both are known, sequence) at the anchored count.
//
// An altered entry fails its hash; a removed, inserted or reordered entry breaks the link of
// the entry after it. Without an anchor, a chain cut at its end, a tenant removed whole, or an
// unkeyed chain recomputed after an edit still verify; a keyed chain cannot be recomputed
// without the secret. After the first finding in a tenant's chain its later entries are
// counted but not checked.
func Check(entries []Entry, o VerifyOptions) *Report {
	r := &Report{Entries: len(entries)}
	ks := newKeys(o)
	tenants := map[chainOf]*tenantState{}
	var order []*tenantState
	anchors := map[chainOf]*Head{}
	if o.Heads != nil {
		for i := range o.Heads.Heads {
			h := &o.Heads.Heads[i]
			anchors[chainOf{h.Tenant, h.Partition}] = h
		}
	}
	ids := map[idDigest]struct{}{}
	lastSeq := map[int]*uint64{} // by partition: each has its own stream
	for i := range entries {
		e := &entries[i]
		k := chainOfEntry(e)
		st := tenants[k]
		if st == nil {
			st = &tenantState{head: Head{Tenant: e.Tenant, Partition: k.part}, anchor: anchors[k]}
			tenants[k] = st
			order = append(order, st)
		}
		if lastSeq[k.part] == nil {
			lastSeq[k.part] = new(uint64)
		}
		keyed := Keyed(e)
		if keyed {
			r.Keyed++
		} else {
			r.Unkeyed++
		}
		if reason := checkEntry(e, st, ks, o.RequireKeyed, lastSeq[k.part], ids); reason != "" && !st.broken {
			st.broken = true
			r.Findings = append(r.Findings, &ChainError{Index: i, Seq: e.Seq, ID: e.ID, Tenant: e.Tenant, Partition: k.part, Reason: reason})
		} else if keyed && len(ks) == 0 && !st.broken {
			r.Unchecked++
		}
		st.keyed = st.keyed || keyed
		st.head.Count++
		st.head.Seq, st.head.Hash, st.head.Time = e.Seq, e.Hash, e.Time.UTC()
		if st.anchor != nil && st.head.Count == st.anchor.Count {
			st.atAnchor, st.atAnchorSeq = e.Hash, e.Seq
		}
	}
	for _, st := range order {
		r.Heads = append(r.Heads, st.head)
	}
	if o.Heads != nil {
		r.checkAnchor(o.Heads, tenants, ks)
	}
	return r
}

// checkEntry checks e against its tenant's chain so far; a reason on a finding. It moves
// lastSeq and records e's id.
func checkEntry(e *Entry, st *tenantState, ks keys, requireKeyed bool, lastSeq *uint64, ids map[idDigest]struct{}) string {
	if e.Seq != 0 {
		if e.Seq <= *lastSeq {
			return fmt.Sprintf("sequence %d after %d: entries reordered or repeated", e.Seq, *lastSeq)
		}
		*lastSeq = e.Seq
	}
	d := digest(e.ID)
	_, dup := ids[d]
	ids[d] = struct{}{}
	if st.broken {
		return ""
	}
	switch {
	case Keyed(e) && len(ks) > 0:
		gen, why := ks.entryGeneration(e, st.gen)
		switch {
		case why != "":
			return why
		case gen < 0:
			return fmt.Sprintf("keyed hash mismatch: the entry was altered, or its chain recomputed without the secret, or hashed under another secret (stored %s, computed %s)",
				short(e.Hash), short(KeyedHashOf(ks.current(), e)))
		}
		st.gen = gen
	case Keyed(e):
		// Not checkable without the secret: Report.Unchecked.
	default:
		if got := HashOf(e); got != e.Hash {
			return fmt.Sprintf("hash mismatch: the entry was altered (stored %s, computed %s)", short(e.Hash), short(got))
		}
		if st.keyed {
			return "an unkeyed entry after a keyed one: the chain was recomputed without the secret from here (or the gateway lost its ledger.secret)"
		}
		if requireKeyed {
			return "an unkeyed entry, and every entry must be keyed: the chain was recomputed without the secret"
		}
	}
	if e.PrevHash != st.head.Hash {
		if st.head.Count == 0 {
			return fmt.Sprintf("prev_hash %s but this is the tenant's first entry: earlier entries were removed", short(e.PrevHash))
		}
		return fmt.Sprintf("prev_hash %s is not the hash of the tenant's previous entry (%s): an entry was removed, inserted or reordered",
			short(e.PrevHash), short(st.head.Hash))
	}
	if dup {
		return "id repeated"
	}
	return ""
}

// checkAnchor adds the findings of the tenants' chains against h.
func (r *Report) checkAnchor(h *Heads, tenants map[chainOf]*tenantState, ks keys) {
	switch {
	case h.MAC == "":
		r.HeadsMAC = MACAbsent
	case len(ks) == 0:
		r.HeadsMAC = MACUnchecked
	default:
		r.HeadsMAC = MACValid
		if reason := ks.headsMAC(h); reason != "" {
			r.HeadsMAC = ""
			r.Findings = append(r.Findings, &AnchorError{Reason: reason})
		}
	}
	for i := range h.Heads {
		a := &h.Heads[i]
		st := tenants[chainOf{a.Tenant, a.Partition}]
		anchored := fmt.Sprintf("%d entries to seq %d, %s", a.Count, a.Seq, short(a.Hash))
		var reason string
		switch {
		case st == nil:
			reason = fmt.Sprintf("anchored with %s, absent from the ledger: the tenant was removed", anchored)
		case st.head.Count < a.Count:
			reason = fmt.Sprintf("%d entries, anchored with %s: entries were cut from the end of the chain", st.head.Count, anchored)
		case st.atAnchor != a.Hash:
			reason = fmt.Sprintf("entry %d has hash %s, anchored with %s: the chain was rewritten up to its anchor (recomputed after an edit)",
				a.Count, short(st.atAnchor), anchored)
		case a.Seq != 0 && st.atAnchorSeq != 0 && st.atAnchorSeq != a.Seq:
			reason = fmt.Sprintf("entry %d is at seq %d, anchored with %s: the stream was rebuilt", a.Count, st.atAnchorSeq, anchored)
		default:
			r.Anchored++
			r.After += st.head.Count - a.Count
			continue
		}
		r.Findings = append(r.Findings, &AnchorError{Tenant: a.Tenant, Partition: a.Partition, Reason: reason})
	}
}

// headsMAC checks h's MAC under the current secret, or a retired one that was current when h
// was created; a reason when it fails.
func (k keys) headsMAC(h *Heads) string {
	switch i, retired := k.signer(h.MAC, h.mac, h.Created); {
	case retired != "":
		return "the MAC is under a secret " + retired + ", and the file was created after it: signed with a retired secret"
	case i < 0:
		return "the MAC does not match: the heads file was altered, or signed under another secret"
	}
	return ""
}

// short is a hash for a message: its scheme prefix and 12 hex digits.
func short(h string) string {
	if h == "" {
		return `""`
	}
	p := ""
	if len(h) > len(KeyedPrefix) && h[:len(KeyedPrefix)] == KeyedPrefix {
		p, h = KeyedPrefix, h[len(KeyedPrefix):]
	}
	if len(h) > 12 {
		h = h[:12] + "…"
	}
	return p + h
}

// headsVersion is the version of the heads file format.
const headsVersion = 1

// maxHeadsFile bounds a heads file ReadHeads accepts.
const maxHeadsFile = 64 << 20

// Heads is a heads file: every tenant's head when it was written, for safekeeping outside
// the ledger, with, when the ledger has a secret, an HMAC over its content (MAC).
type Heads struct {
	Version int       `json:"version"`
	Created time.Time `json:"created"`
	Heads   []Head    `json:"heads"`
	// MAC is KeyedPrefix + hex(HMAC-SHA-256(a key derived from the secret, the JSON of
	// version, created and heads)); empty without a secret.
	MAC string `json:"mac,omitempty"`
}

// NewHeads is the heads file of heads, created at created, with a MAC when secret is set.
func NewHeads(heads []Head, created time.Time, secret []byte) *Heads {
	h := &Heads{Version: headsVersion, Created: created.UTC(), Heads: make([]Head, len(heads))}
	for i, hd := range heads {
		hd.Time = hd.Time.UTC()
		h.Heads[i] = hd
	}
	if len(secret) > 0 {
		h.MAC = h.mac(secret)
	}
	return h
}

// headsKeyLabel derives the heads MAC key from the secret, apart from the chain's key.
const headsKeyLabel = "oncegate ledger heads v1"

// mac is the MAC h should carry under secret.
func (h *Heads) mac(secret []byte) string {
	k := hmac.New(sha256.New, secret)
	k.Write([]byte(headsKeyLabel))
	m := hmac.New(sha256.New, k.Sum(nil))
	m.Write(h.content())
	return KeyedPrefix + hex.EncodeToString(m.Sum(nil))
}

// content is the bytes the MAC covers: the JSON of everything but the MAC.
func (h *Heads) content() []byte {
	b, err := json.Marshal(struct {
		Version int       `json:"version"`
		Created time.Time `json:"created"`
		Heads   []Head    `json:"heads"`
	}{h.Version, h.Created, h.Heads})
	if err != nil { // strings, ints and UTC times always marshal
		panic(fmt.Sprintf("ledger: heads content: %v", err))
	}
	return b
}

// WriteHeads writes h as indented JSON.
func WriteHeads(w io.Writer, h *Heads) error {
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return fmt.Errorf("ledger: write heads: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("ledger: write heads: %w", err)
	}
	return nil
}

// ReadHeads parses a heads file written by WriteHeads. Anything else — an unknown field, a
// version other than 1, a tenant twice in one partition, a partition out of range, an empty tenant, a count below 1, a hash or MAC that
// is not one, trailing data — is an ErrCorrupt. It does not check the MAC (Check does, with
// the secret).
func ReadHeads(r io.Reader) (*Heads, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxHeadsFile+1))
	if err != nil {
		return nil, fmt.Errorf("ledger: read heads: %w", err)
	}
	if len(data) > maxHeadsFile {
		return nil, fmt.Errorf("ledger: read heads: %w: larger than %d bytes", ErrCorrupt, maxHeadsFile)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("ledger: read heads: %w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var h Heads
	if err := dec.Decode(&h); err != nil {
		return nil, bad("%v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, bad("trailing data")
	}
	if h.Version != headsVersion {
		return nil, bad("version %d, want %d", h.Version, headsVersion)
	}
	if h.MAC != "" && !validHash(h.MAC, true) {
		return nil, bad("the mac is not %s and 64 hex digits", KeyedPrefix)
	}
	h.Created = h.Created.UTC()
	seen := make(map[chainOf]bool, len(h.Heads))
	for i := range h.Heads {
		hd := &h.Heads[i]
		k := chainOf{hd.Tenant, hd.Partition}
		switch {
		case hd.Tenant == "":
			return nil, bad("head %d: empty tenant", i)
		case hd.Partition < 0 || hd.Partition >= partition.Max:
			return nil, bad("head %d (tenant %q): partition %d out of range", i, hd.Tenant, hd.Partition)
		case seen[k]:
			return nil, bad("head %d: tenant %q twice", i, hd.Tenant)
		case hd.Count < 1:
			return nil, bad("head %d (tenant %q): count %d, want at least 1", i, hd.Tenant, hd.Count)
		case !validHash(hd.Hash, false):
			return nil, bad("head %d (tenant %q): hash %q is not an entry hash", i, hd.Tenant, hd.Hash)
		}
		seen[k] = true
		hd.Time = hd.Time.UTC()
	}
	return &h, nil
}

// validHash reports whether h is an entry hash: 64 lowercase hex digits, after KeyedPrefix if
// keyedOnly, optionally after it otherwise.
func validHash(h string, keyedOnly bool) bool {
	if len(h) > len(KeyedPrefix) && h[:len(KeyedPrefix)] == KeyedPrefix {
		h = h[len(KeyedPrefix):]
	} else if keyedOnly {
		return false
	}
	if len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
