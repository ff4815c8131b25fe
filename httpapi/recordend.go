package httpapi

import (
	"context"
	"errors"
	"hash/crc32"
	"net/http"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/kv"
)

// A live stream can wait for a terminal chunk that never comes although its execution ended:
// a NATS failure lost the chunk (a partition, a stream recreated after a restart), or its
// worker died between the record and the chunk. The record is the truth, so a live stream
// that has been idle for a heartbeat reads it; when it says the execution ended, the stream
// ends from the record exactly as a replay of it would, provided what the client already got
// is the start of the record's events (the same epoch, the same bytes). Anything else ends
// with an explicit error event: never a splice, never a silent end.

// recordEnded is what a live stream's record check found: the execution ended (rec is
// finished) or moved to another epoch (rec is PENDING, taken over after the fence was lost).
type recordEnded struct{ rec *kv.Record }

func (e *recordEnded) Error() string { return "httpapi: the execution ended without a terminal chunk" }

// recordCheck is a live stream's idle check of key's record, followed at epoch: nil while the
// record is PENDING at that epoch or cannot be read now (the chunk may still come), a
// *recordEnded otherwise.
func recordCheck(ctx context.Context, intents *intent.Core, key string, epoch int) func() error {
	return func() error {
		rec, err := intents.Record(ctx, key)
		if err != nil || (rec.State == kv.Pending && rec.Epoch == epoch) {
			return nil
		}
		return &recordEnded{rec: rec}
	}
}

// endedRecord is the record an error of nextChunk carries, if it is a recordEnded.
func endedRecord(err error) (*kv.Record, bool) {
	var re *recordEnded
	if errors.As(err, &re) {
		return re.rec, true
	}
	return nil, false
}

// liveSent is what a chat stream sent of its epoch: the data chunks' bytes as stored (their
// count and checksum, not a copy) and whether the usage chunk passed.
type liveSent struct {
	n     int
	crc   uint32
	usage bool
}

func (s *liveSent) data(payload []byte) {
	s.n += len(payload)
	s.crc = crc32.Update(s.crc, crc32.IEEETable, payload)
}

// continues reports whether events start with what was sent.
func (s *liveSent) continues(events []byte) bool {
	return s.n <= len(events) && crc32.ChecksumIEEE(events[:s.n]) == s.crc
}

// tail is what a chat stream that followed epoch and sent sent still writes to end as rec's
// replay ends: the rest of the events, the usage frame if asked for and not yet sent, then
// [DONE], or after a failure its error event. ok is false when rec does not continue the
// stream (another epoch, other bytes, no result).
func (w wire) tail(rec *kv.Record, epoch int, sent *liveSent, includeUsage bool) (out []byte, ok bool) {
	res := rec.Result
	if rec.State == kv.Pending || rec.Epoch != epoch || res == nil || !rec.Stream {
		return nil, false
	}
	switch {
	case rec.State == kv.Completed && res.Status == http.StatusOK && sent.continues(res.Events):
		out = append(out, w.events(res.Events[sent.n:], includeUsage)...)
		if includeUsage && !sent.usage {
			out = append(out, res.UsageEvent...)
		}
		return append(out, w.doneFrame()...), true
	case rec.State == kv.Failed && res.Partial && sent.continues(res.Events):
		out = append(out, w.events(res.Events[sent.n:], includeUsage)...)
		return append(out, w.errorFrame(failureBody(w, res))...), true
	}
	return nil, false
}

// failureBody is the error a failed execution's stream ends with.
func failureBody(w wire, res *kv.Result) []byte {
	if len(res.Body) == 0 {
		return w.errorBody(errExecutionFailed)
	}
	return res.Body
}
