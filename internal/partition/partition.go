// Package partition splits the gateway's per-intent store into partitions: each partition has
// its own copy of every stream and bucket an intent touches (so its own Raft leaders), and an
// intent lives in one partition from its claim to its charge.
//
// A record key carries its partition: partition 0 keeps the plain key (32 hex digits), so the
// one-partition layout, names and keys are exactly those of an unpartitioned store, and
// partition k ≥ 1 prefixes it with "p<k>-". Anything holding a key (a job, a chunk subject, a
// charge) therefore finds its partition without knowing the count. A job id (a ULID) carries
// its partition in its last character when there is more than one.
//
// Streams and subjects of partition k ≥ 1 are the base names with "_P<k>" appended and
// subjects with "p<k>." in front: IDEM_P1 ($KV.IDEM_P1.>), JOBS_P1 (p1.jobs.run.>), and so on.
package partition

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Max is the most partitions a store may have: far above what a Raft group per stream per
// partition makes sensible on a cluster, and the job id's last character (32 values) bounds it.
const Max = 32

// ErrCount is returned for a partition count outside 1..Max.
var ErrCount = errors.New("partition: count out of range")

// P is a partition's index, from 0.
type P int

// Stream is the name of base's copy in p: base itself in partition 0, base_P<k> otherwise.
func (p P) Stream(base string) string {
	if p == 0 {
		return base
	}
	return base + "_P" + strconv.Itoa(int(p))
}

// Subject is a subject prefix or filter of p: prefix itself in partition 0, "p<k>." and
// prefix otherwise.
func (p P) Subject(prefix string) string {
	if p == 0 {
		return prefix
	}
	return "p" + strconv.Itoa(int(p)) + "." + prefix
}

// Tag is the placement tag of p's streams on a cluster whose nodes are split among the
// partitions (docs/operations/cluster.md).
func (p P) Tag() string { return "og-p" + strconv.Itoa(int(p)) }

// All lists the partitions of a store of count partitions.
func All(count int) []P {
	ps := make([]P, max(count, 1))
	for i := range ps {
		ps[i] = P(i)
	}
	return ps
}

// Check reports whether count is a valid partition count.
func Check(count int) error {
	if count < 1 || count > Max {
		return fmt.Errorf("%w: %d (1 to %d)", ErrCount, count, Max)
	}
	return nil
}

// Key is the record key of hex (a record key's hash, as intent makes it) in a store of count
// partitions: hex itself in partition 0 (and always with one partition), "p<k>-" and hex in
// partition k. The partition is the hash's first 8 bytes modulo count, so keys spread evenly.
func Key(count int, hex string) string {
	if count <= 1 {
		return hex
	}
	sum := sha256.Sum256([]byte(hex))
	k := binary.BigEndian.Uint64(sum[:8]) % uint64(count) // #nosec G115 -- count is 2..Max
	return P(k).Tagged(hex)                               // #nosec G115 -- k < count ≤ Max
}

// Tagged is hex as a record key of p: hex itself in partition 0, "p<k>-" and hex otherwise.
// A key derived from another (an archived copy) is tagged with the other's partition, so
// both stay in one partition.
func (p P) Tagged(hex string) string {
	if p == 0 {
		return hex
	}
	return "p" + strconv.Itoa(int(p)) + "-" + hex
}

// OfKey is the partition of a record key (see Key).
func OfKey(key string) P {
	if len(key) < 3 || key[0] != 'p' {
		return 0
	}
	end := strings.IndexByte(key, '-')
	if end < 2 {
		return 0
	}
	k, err := strconv.Atoi(key[1:end])
	if err != nil || k < 1 || k >= Max {
		return 0
	}
	return P(k)
}

// Untagged is key without its partition prefix: the hash intent made.
func Untagged(key string) string {
	if OfKey(key) == 0 {
		return key
	}
	return key[strings.IndexByte(key, '-')+1:]
}

// crockford is the ULID alphabet; a job id's last character is one of its 32 symbols.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// ID marks job id (a ULID string) as partition p's in a store of count partitions: its last
// character, 5 of its 80 random bits, names p. With one partition the id is unchanged.
func ID(count int, id string, p P) string {
	if count <= 1 || id == "" {
		return id
	}
	return id[:len(id)-1] + string(crockford[p])
}

// OfID is the partition job id belongs to in a store of count partitions; ok is false when
// the id names no partition of it (an id made for another count, or not a job id).
func OfID(count int, id string) (P, bool) {
	if count <= 1 {
		return 0, true
	}
	if id == "" {
		return 0, false
	}
	k := strings.IndexByte(crockford, id[len(id)-1])
	if k < 0 || k >= count {
		return 0, false
	}
	return P(k), true
}

// OfSubject is the partition of a subject made by P.Subject (its first token "p<k>"), 0 for
// any other subject.
func OfSubject(subject string) P {
	dot := strings.IndexByte(subject, '.')
	if dot < 2 || subject[0] != 'p' {
		return 0
	}
	k, err := strconv.Atoi(subject[1:dot])
	if err != nil || k < 1 || k >= Max {
		return 0
	}
	return P(k)
}

// State is one partition as a node's last readiness check found it (/readyz's detail, the
// partition metrics).
type State struct {
	Partition P `json:"partition"`
	// Admits says its record and job streams each have a leader with a quorum; Reason says
	// why not.
	Admits bool   `json:"admits"`
	Reason string `json:"reason,omitempty"`
	// Leads are the partition's streams whose leader is this node's NATS server (an
	// embedded server; empty on an external NATS, where it is not known).
	Leads []string `json:"leads,omitempty"`
}
