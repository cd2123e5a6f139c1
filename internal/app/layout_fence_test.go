package app_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/lua"
)

// TestFenceLayouts: a node whose Redis has no layout markers rewrites the
// account hashes of an older layout before it would serve (serve calls
// FenceLayouts before it listens), and with the markers set it finds
// nothing to do.
func TestFenceLayouts(t *testing.T) {
	n := startNode(t, nil, nil)
	ctx := context.Background()
	customer, account, block := uuid.New(), uuid.New(), uuid.New()
	key := fmt.Sprintf("{%s:p%02d}:a:%s", n.Prefix, lua.Partition(customer), customer)
	if err := n.Redis.HSet(ctx, key, "v", "1", "id", account.String(), "rs", "0", "le", "100", "ua", "1",
		"b:"+block.String(), `100|100|0|1||||{"k":"v"}`).Err(); err != nil {
		t.Fatal(err)
	}
	if pending, err := n.App.Store.LayoutsPending(ctx); err != nil || len(pending) != lua.Partitions {
		t.Fatalf("pending on a new Redis: %v %v", pending, err)
	}
	if err := n.App.FenceLayouts(ctx); err != nil {
		t.Fatal(err)
	}
	h := n.Redis.HGetAll(ctx, key).Val()
	want := map[string]string{"v": "1", "id": engine.CompactID(account), "le": "100", "ua": "1",
		"b:" + engine.CompactID(block): "100||0|1|||", "m:" + engine.CompactID(block): `{"k":"v"}`}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Fatalf("after the fence\n got %v\nwant %v", h, want)
	}
	if pending, err := n.App.Store.LayoutsPending(ctx); err != nil || len(pending) != 0 {
		t.Fatalf("pending after the fence: %v %v", pending, err)
	}
	if err := n.App.FenceLayouts(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(n.log.String(), "account hashes in the current layout") {
		t.Error("the rewrite was not logged")
	}
}
