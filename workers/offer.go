package workers

import "github.com/oncegate/oncegate/kv"

// Offer holds rec, the record a job of key's epoch is submitted with at revision rev, request
// included, for this pool's worker that takes the job (handle). That worker then neither decodes
// the record the message carries nor, for a request stored in REQUESTS, reads the request back:
// on one node that is every job, whose request and record the admitting handler holds anyway.
// withdraw ends the offer (the admission is over); a job taken after that, a redelivery, or a
// job taken on another node reads what the message and the streams hold. rec is not changed
// after the call, here or by the caller.
func (p *Pool) Offer(key string, epoch int, rev uint64, rec *kv.Record) (withdraw func()) {
	k := offerKey{key, epoch, rev}
	p.offers.Store(k, rec)
	return func() { p.offers.Delete(k) }
}

// offered takes the record offered for key's epoch at rev, once; the caller gets its own copy.
func (p *Pool) offered(key string, epoch int, rev uint64) (*kv.Record, bool) {
	v, ok := p.offers.LoadAndDelete(offerKey{key, epoch, rev})
	if !ok {
		return nil, false
	}
	rec := *v.(*kv.Record)
	return &rec, true
}

type offerKey struct {
	key   string
	epoch int
	rev   uint64
}
