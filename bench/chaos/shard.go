package main

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/creditd/creditd/lua"
)

// keyPrefix is creditd's Redis key prefix in the fleet
// (CREDITD_REDIS_PREFIX's default; scripts/fleet.sh does not set it).
const keyPrefix = "cd"

// clusterSlots is Redis Cluster's slot count.
const clusterSlots = 16384

// crc16 is Redis Cluster's key hash, CRC-16/XMODEM (polynomial 0x1021,
// initial 0).
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for i := 0; i < 8; i++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is the cluster slot of key, as CLUSTER KEYSLOT computes it: only
// the part between the first "{" and the next "}" is hashed when that part
// is not empty.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16([]byte(key)) % clusterSlots)
}

// customerSlot is the slot of every key of a customer: its outbox
// partition's hash tag `{<prefix>:pNN}` (lua.Partition).
func customerSlot(customer uuid.UUID) int {
	return keySlot(fmt.Sprintf("{%s:p%02d}", keyPrefix, lua.Partition(customer)))
}

// idemRecordKey is the Redis key of a tenant's HTTP idempotency record for
// an Idempotency-Key, as lua/idempotency.go names it: "{prefix:i:" and the
// base64url of the first 12 bytes of sha256(tenant, key), no closing
// brace, so the record's slot is the whole key's, not the customer's. A
// money call therefore needs two masters: the record's and the customer's.
// The run checks this copy against Redis (recordSlotsVerified) before it
// trusts it.
func idemRecordKey(tenant uuid.UUID, key string) string {
	h := sha256.New()
	h.Write(tenant[:])
	h.Write([]byte(key))
	return "{" + keyPrefix + ":i:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:12])
}

// Shard is one master's slots at a moment of the run.
type Shard struct {
	Master string   `json:"master"`
	Ranges [][2]int `json:"slots"`
}

// has reports whether slot is one of the shard's.
func (s Shard) has(slot int) bool {
	for _, r := range s.Ranges {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// String is the master and its slot ranges.
func (s Shard) String() string {
	var rs []string
	for _, r := range s.Ranges {
		if r[0] == r[1] {
			rs = append(rs, strconv.Itoa(r[0]))
		} else {
			rs = append(rs, fmt.Sprintf("%d-%d", r[0], r[1]))
		}
	}
	return s.Master + " (slots " + strings.Join(rs, " ") + ")"
}

// shardsOf is the serving masters of a CLUSTER NODES view with their slot
// ranges, in the order of their first slot (pickMaster's order). Slots
// being migrated ("[...]") are left out.
func shardsOf(nodes []ClusterNode) []Shard {
	var out []Shard
	for _, n := range nodes {
		if !n.has("master") || n.has("fail") || len(n.Slots) == 0 {
			continue
		}
		s := Shard{Master: n.Addr}
		for _, r := range n.Slots {
			if r == "" || r[0] == '[' {
				continue
			}
			a, b, found := strings.Cut(r, "-")
			lo, err1 := strconv.Atoi(a)
			hi, err2 := lo, error(nil)
			if found {
				hi, err2 = strconv.Atoi(b)
			}
			if err1 == nil && err2 == nil {
				s.Ranges = append(s.Ranges, [2]int{lo, hi})
			}
		}
		if len(s.Ranges) > 0 {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ranges[0][0] < out[j].Ranges[0][0] })
	return out
}

// shardIndex is the index in shards of the shard serving slot, or -1.
func shardIndex(shards []Shard, slot int) int {
	for i, s := range shards {
		if s.has(slot) {
			return i
		}
	}
	return -1
}
