package intent

import (
	"context"
	"errors"
	"net/http"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// Cancel cancels tenant's job id: a PENDING record becomes FAILED and cancelled by
// compare-and-set, which also fences its worker (its next record or chunk write fails and it
// stops the backend call), and the execution's followers get errorBody(rec.API) as an error
// event. A finished job is left as it is. It returns the record as it stands afterwards.
func (c *Core) Cancel(ctx context.Context, tenant, id string, errorBody func(api string) []byte) (*kv.Record, error) {
	for range maxDecisions {
		key, rec, rev, err := c.FindJob(ctx, tenant, id)
		if err != nil {
			return nil, err
		}
		if rec.State != kv.Pending {
			return rec, nil
		}
		body := errorBody(rec.API)
		// An attempt already sent keeps running at the backend until the worker sees the
		// cancel: its progress puts it in the record, counted and charged, never hidden.
		p, err := c.storeOf(key).Progress(ctx, rec.JobID, rec.Epoch)
		if err != nil {
			p = nil
		}
		next := rec.CancelledAt(c.now(), body, p)
		if _, err := c.storeOf(key).Update(ctx, key, next, rev); err != nil {
			if errors.Is(err, kv.ErrConflict) {
				continue
			}
			return nil, err
		}
		if err := jobs.Terminate(ctx, c.js, key, rec.JobID, rec.Epoch, jobs.KindError, http.StatusConflict, body); err != nil {
			c.log.Warn().Err(err).Str(fieldJobID, rec.JobID).Msg("cancel: notifying followers")
		}
		if err := c.storeOf(key).DropRequest(ctx, key, next); err != nil {
			c.log.Debug().Err(err).Str(fieldJobID, rec.JobID).Msg("cancel: dropping the stored request")
		}
		c.log.Info().Str(fieldJobID, rec.JobID).Msg("job cancelled")
		return next, nil
	}
	return nil, ErrJobChanging
}
