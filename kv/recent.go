package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsretry"
)

// Recent executions of a bypassed request's content. A request sent with X-Allow-Duplicate
// executes every time, but an SDK that sent it also retries it on a timeout, and each retry
// executed again (issue 34: 48-65 duplicate executions per 10,000 intents in every run). So
// the executions of bypassed requests whose client said it retries (x-stainless-retry-count
// 0) are listed per content, and a retry of such a request (count ≥ 1) joins the one
// execution of its content listed lately, when there is exactly one (intent decides).
//
// The list is one value in the records' bucket, changed by compare-and-set (two executions
// started at once are both listed, so a retry can tell the content is ambiguous). It costs a
// bypassed SDK request a read and a synced write; a bypass without the retry header costs
// nothing more.

// RecentExec is one listed execution: its record key and job, and when it started.
type RecentExec struct {
	Key string    `json:"k"`
	Job string    `json:"j"`
	At  time.Time `json:"t"`
	// Retry: listed by a retry that found its attempt not listed yet (the attempt's listing
	// waited out an election); the attempt, when it comes, joins it (Matched) instead of
	// executing.
	Retry   bool `json:"r,omitempty"`
	Matched bool `json:"m,omitempty"`
}

// maxRecent bounds one content's list (the oldest go first).
const maxRecent = 16

func recentKey(content string) string { return "recent." + content }

// DecideRecent reads content's list (without the executions started before since) and
// writes what decide makes of it, by compare-and-set: decide runs again on the list as it
// then stands when another writer got there first, so every decision is taken on the list it
// changes. decide returns the list to write, or nil to write nothing.
func (s *Store) DecideRecent(ctx context.Context, content string, since time.Time, decide func([]RecentExec) []RecentExec) error {
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		for {
			list, rev, err := s.recent(ctx, content)
			if err != nil {
				return err
			}
			list = decide(fresh(list, since))
			if list == nil {
				return nil
			}
			if len(list) > maxRecent {
				list = list[len(list)-maxRecent:]
			}
			data, err := json.Marshal(list)
			if err != nil {
				return err
			}
			if rev == 0 {
				_, err = s.kv.Create(ctx, recentKey(content), data)
			} else {
				_, err = s.kv.Update(ctx, recentKey(content), data, rev)
			}
			if casLost(err) { // another writer changed it first: decide again
				continue
			}
			return err
		}
	})
	if err != nil {
		return fmt.Errorf("kv: recent %s: %w", content, err)
	}
	return nil
}

// recent reads content's list and its revision (0: none).
func (s *Store) recent(ctx context.Context, content string) ([]RecentExec, uint64, error) {
	e, err := s.kv.Get(ctx, recentKey(content))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var list []RecentExec
	if json.Unmarshal(e.Value(), &list) != nil {
		return nil, e.Revision(), nil // unreadable: as if empty, and the next write replaces it
	}
	return list, e.Revision(), nil
}

// casLost reports whether a Create or Update lost its compare-and-set (a single server's and
// a replicated bucket's error codes alike).
func casLost(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant))
}

// fresh is list without the executions started before since.
func fresh(list []RecentExec, since time.Time) []RecentExec {
	return slices.DeleteFunc(list, func(e RecentExec) bool { return e.At.Before(since) })
}
