package replicas

import "time"

// View is a stream's Raft group as one of its own servers sees it in memory, without a
// JetStream request: what an embedded server tells the gateway in its process (natsrv).
type View struct {
	// Leader is the leader's server name: this server's when it leads, else the leader it has
	// heard from within Heard; "" when it knows of none it hears from (an election, a cut).
	Leader string
	// Since is when Leader was elected as far as this server knows: the election itself when
	// this server leads, else when it first saw this leader in this term (later than the
	// election, never earlier). Zero when not known (a single server).
	Since time.Time
	// Quorate says the leader has heard from a quorum of the group (itself included) within
	// Heard: it can commit. A leader that has not is cut off from the others.
	Quorate bool
	// Leads says this server is the leader.
	Leads bool
}

// Local reads a stream's View from the server in this process; ok is false when it cannot
// tell (no server in the process, the stream has no replica on it, or it follows a leader of
// a group larger than three, whose quorum it cannot see), and the stream's leader must be
// asked instead. nil means no server in the process.
type Local func(stream string) (v View, ok bool)
