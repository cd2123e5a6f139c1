package client

import (
	"bytes"
	"encoding/json"
)

// Nullable is an optional input member that may also be sent as null,
// where the API tells the two apart (UpdateOverrideInput.ExpiresAt: null
// makes the override permanent, omitted keeps its expiry). The zero value
// is omitted; Null sends null; Value sends v.
type Nullable[T any] struct {
	value T
	set   bool
	null  bool
}

// Value is a Nullable that sends v.
func Value[T any](v T) Nullable[T] { return Nullable[T]{value: v, set: true} }

// Null is a Nullable that sends null.
func Null[T any]() Nullable[T] { return Nullable[T]{set: true, null: true} }

// IsZero reports whether n is unset, so omitzero leaves it out.
func (n Nullable[T]) IsZero() bool { return !n.set }

// Get is n's value and whether it has one (false when unset or null).
func (n Nullable[T]) Get() (T, bool) { return n.value, n.set && !n.null }

// IsNull reports whether n is set to null.
func (n Nullable[T]) IsNull() bool { return n.set && n.null }

// MarshalJSON writes null or the value.
func (n Nullable[T]) MarshalJSON() ([]byte, error) {
	if !n.set || n.null {
		return []byte("null"), nil
	}
	return json.Marshal(n.value)
}

// UnmarshalJSON reads null or a value; either way n is then set.
func (n *Nullable[T]) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*n = Null[T]()
		return nil
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*n = Value(v)
	return nil
}
