package intent

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/kv"
)

// AttachHeld is Admit's decision for a key whose claim was refused, given the record the
// claim read; a test passes an older one, what a replica that has not caught up answers.
func (c *Core) AttachHeld(ctx context.Context, req *Request, rec *kv.Record, rev uint64) (*Admission, error) {
	return c.attach(ctx, req, &kv.ExistsError{Record: rec, Rev: rev}, false)
}

// FinishedFor is the Finished event of rec, a finished record, for a delivery that followed
// epoch and sent sentData (and the usage frame when usageSent).
func FinishedFor(rec *kv.Record, epoch int, sentData []byte, usageSent bool) Event {
	d := &Delivery{key: "k", epoch: epoch}
	d.sent.data(sentData)
	d.sent.usage, d.sent.any = usageSent, len(sentData) > 0 || usageSent
	return d.finished(rec)
}

// NoteRefused and ReleaseRefusals expose one refusal and one pass of RunRefusals.
func (c *Core) NoteRefused(key string, rec *kv.Record, err error) { c.noteRefused(key, rec, err) }
func (c *Core) ReleaseRefusals(ctx context.Context)               { c.releaseRefusals(ctx) }

// StoreWait is how long Admit waits for an unavailable store before it refuses req.
func (c *Core) StoreWait(req *Request) time.Duration { return c.storeWait(req) }
