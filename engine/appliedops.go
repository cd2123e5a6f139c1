package engine

// The idempotency room (engine/idempotency/README.md) declares every window
// of idempotency (idempotency.ReplayWindow, OpKeyGrace, SeenHorizon and the
// rest) and the HTTP record's types and port. OpRef stays here because it
// carries a CustomerKey, and the room imports no creditd package.

// OpRef names one idempotency key of one customer.
type OpRef struct {
	Customer CustomerKey
	Key      string
}
