package intent_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// taken is what one concurrent taker ended with.
type taken struct {
	rec *kv.Record        // the record the taker holds afterwards (nil on error)
	adm *intent.Admission // a taker that admitted a copy
	err error
}

// race runs the takers at once and returns what each ended with.
func race(takers ...func() taken) []taken {
	out := make([]taken, len(takers))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, take := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = take()
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// TestTakeOverRace: a PENDING record whose lease ran out and whose job JOBS no longer holds
// (its worker vanished) is moved to the next epoch by exactly one of two concurrent takers;
// the other loses the compare-and-set or joins the winner's epoch. The old epoch is fenced:
// its worker can publish nothing more, its followers see the fence, and the first client
// follows the execution to the new epoch.
func TestTakeOverRace(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name   string
		takers func(t *testing.T, req *intent.Request, rec *kv.Record, rev uint64) []func() taken
		// won: how many takers succeed; jobs: epoch-2 jobs published.
		won, jobs int
	}{
		{name: "two TakeOver calls", won: 1, jobs: 0,
			takers: func(t *testing.T, req *intent.Request, rec *kv.Record, rev uint64) []func() taken {
				take := func() taken {
					_, nrec, _, err := intent.TakeOver(context.Background(), e.srv.JS, e.store, req.Key, rec, rev, e.clock.Now, lease)
					return taken{rec: nrec, err: err}
				}
				return []func() taken{take, take}
			}},
		{name: "two API nodes admit a copy", won: 2, jobs: 1,
			takers: func(t *testing.T, req *intent.Request, _ *kv.Record, _ uint64) []func() taken {
				var takers []func() taken
				for _, c := range []*intent.Core{e.core, e.otherNode(t)} {
					takers = append(takers, func() taken {
						adm, err := c.Admit(context.Background(), req)
						if err != nil {
							return taken{err: err}
						}
						t.Cleanup(adm.Close)
						if adm.Outcome != intent.Joined {
							return taken{err: errors.New("outcome " + string(adm.Outcome))}
						}
						return taken{rec: adm.Rec, adm: adm}
					})
				}
				return takers
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			req := request(t.Name())
			first := admit(t, e.core, req)
			oldJob := e.take(t, req.Key) // its worker took it, then vanished
			oldPub := jobs.NewPublisher(e.srv.JS, oldJob)
			e.clock.Add(lease + time.Second)
			rec, rev := e.get(t, req.Key)
			e.jobs.count(t, "")

			results := race(tc.takers(t, req, rec, rev)...)
			won := 0
			for i, r := range results {
				switch {
				case r.err == nil:
					won++
					// A copy whose stale read of epoch 1 comes after the winner's epoch-2 job
					// is in JOBS takes the key's job for epoch 1's and joins the fenced epoch;
					// its Next follows the fence (checked below).
					if (r.rec.Epoch != 2 && (r.adm == nil || r.rec.Epoch != 1)) || r.rec.JobID != first.JobID {
						t.Fatalf("taker %d holds job %s epoch %d, want job %s epoch 2", i, r.rec.JobID, r.rec.Epoch, first.JobID)
					}
				case !errors.Is(r.err, kv.ErrConflict):
					t.Fatalf("taker %d: %v", i, r.err)
				}
			}
			if won != tc.won {
				t.Fatalf("%d takers succeeded, want %d: %+v", won, tc.won, results)
			}
			if n := e.jobs.count(t, req.Key); n != tc.jobs {
				t.Fatalf("%d jobs published for the new epoch, want %d", n, tc.jobs)
			}
			now, _ := e.get(t, req.Key)
			if now.State != kv.Pending || now.Epoch != 2 || now.Takeovers != 1 || now.JobID != first.JobID {
				t.Fatalf("record %s epoch %d, %d takeovers, job %s", now.State, now.Epoch, now.Takeovers, now.JobID)
			}

			// The old epoch is fenced: its worker's writes are refused, and a follower of it
			// reads the fence.
			if err := oldPub.Publish(ctx, jobs.KindData, 0, []byte("zombie")); !errors.Is(err, jobs.ErrFenced) {
				t.Fatalf("old epoch's publisher: %v, want ErrFenced", err)
			}
			old, err := e.core.Follow(ctx, req.Key, first.JobID, 1, req.Stream)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			if c, err := old.Next(ctx); err != nil || c.Kind != jobs.KindFence {
				t.Fatalf("old epoch's first chunk: %+v %v, want the fence", c, err)
			}
			// The first client, which read nothing of the old epoch, and the copies follow the
			// new one.
			if err := e.publisher(t, req.Key).Publish(ctx, jobs.KindData, 0, []byte("epoch 2")); err != nil {
				t.Fatal(err)
			}
			clients := []*intent.Admission{first}
			for _, r := range results {
				if r.adm != nil {
					clients = append(clients, r.adm)
				}
			}
			for i, adm := range clients {
				if c := next(t, adm); c.Index() != 0 || string(c.Payload()) != "epoch 2" || adm.Rec.Epoch != 2 {
					t.Fatalf("client %d read chunk %d %q at epoch %d", i, c.Index(), c.Payload(), adm.Rec.Epoch)
				}
			}
		})
	}
}

// TestNoTakeOverWhileQueued: an expired lease alone does not move the record while JOBS still
// holds its job (it will run, or be redelivered): the copy joins the same epoch.
func TestNoTakeOverWhileQueued(t *testing.T) {
	e := newEnv(t, nil)
	req := request(t.Name())
	first := admit(t, e.core, req)
	first.Close()
	e.clock.Add(lease + time.Second)
	adm := admit(t, e.otherNode(t), req)
	if rec, _ := e.get(t, req.Key); adm.Outcome != intent.Joined || rec.Epoch != 1 || rec.Takeovers != 0 {
		t.Fatalf("%s; record epoch %d, %d takeovers; want joined at epoch 1", adm.Outcome, rec.Epoch, rec.Takeovers)
	}
}
