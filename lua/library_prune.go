package lua

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every creditd build loads its own library (its functions carry the
// version, library.go), and Redis keeps a library until it is deleted: a
// node that has served many deploys holds one per build, each a few
// hundred KB of compiled Lua that every script's garbage collector walks.
// So a Store that loads its library onto a node also deletes the oldest
// creditd libraries there beyond libraryKeep. A rolling upgrade runs two
// builds at once and a rollback a third, so those stay; a build whose
// library was deleted while it still runs loads it again on its next call
// (isMissingCode), so pruning is never wrong, at worst a load.
const libraryKeep = 3

// libraryRegistry is the hash of library version -> Unix ms of its last
// load, shared by every creditd on the server (libraries are per server,
// not per key prefix): the order pruning keeps.
const libraryRegistry = "creditd:libraries"

// libraryPrefix opens the name of every creditd library.
const libraryPrefix = "creditd_"

// noteLibraryLoad records that this build's library was loaded now; it is
// best effort (an ACL that refuses the key leaves pruning by name order).
func (s *Store) noteLibraryLoad(ctx context.Context, now time.Time) {
	_ = s.rdb.HSet(ctx, libraryRegistry, library().version, now.UnixMilli()).Err()
}

// pruneLibraries deletes from node c the creditd libraries past the
// libraryKeep most recently loaded, never this build's. Best effort: a
// refusal (no FUNCTION DELETE for this user, a node going away) leaves
// them for the next load.
func (s *Store) pruneLibraries(ctx context.Context, c redis.Cmdable) {
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: libraryPrefix + "*"}).Result()
	if err != nil || len(libs) <= libraryKeep {
		return
	}
	loaded, _ := s.rdb.HGetAll(ctx, libraryRegistry).Result()
	own := library().version
	versions := make([]string, 0, len(libs))
	for _, l := range libs {
		versions = append(versions, strings.TrimPrefix(l.Name, libraryPrefix))
	}
	// Newest first; a version never recorded (a build before this code)
	// counts as the oldest.
	at := func(v string) int64 {
		if v == own {
			return 1<<63 - 1
		}
		ms, _ := strconv.ParseInt(loaded[v], 10, 64)
		return ms
	}
	slices.SortFunc(versions, func(a, b string) int {
		if d := at(b) - at(a); d != 0 {
			if d > 0 {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	for _, v := range versions[libraryKeep:] {
		if err := c.FunctionDelete(ctx, libraryPrefix+v).Err(); err == nil {
			_ = s.rdb.HDel(ctx, libraryRegistry, v).Err()
		}
	}
}
