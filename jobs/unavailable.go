package jobs

import "github.com/oncegate/oncegate/internal/jsretry"

// ErrUnavailable is returned when NATS kept failing with transient errors (an election, a
// reconnect) for the whole retry window. It is jsretry.ErrUnavailable (and kv.ErrUnavailable).
var ErrUnavailable = jsretry.ErrUnavailable
