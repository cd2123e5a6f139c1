-- feed.lua owns trimming a tenant's change feed (issue 27), shared by
-- stamp.lua (a config change) and reservation_note.lua (a reservation
-- notice).

-- feed_trim trims feed, a stream, back to its cap once it holds a tenth
-- more, and leaves the last entry it trimmed as the horizon (field "x" of
-- the tenant's stamps hash stamps): a reader resuming before it has missed
-- changes. Trimmed a batch at a time: an entry deleted alone stays in its
-- stream node, flagged, until the node's last goes, and every read from
-- the front steps over the flagged ones: trimming one entry per append
-- (XRANGE of the oldest, then XDEL) cost ~65,000 instructions a call at
-- the cap, against a few thousand amortized now. XTRIM MINID keeps the
-- first entry past the batch's last.
local function feed_trim(feed, stamps, feed_cap)
  local n = redis.call('XLEN', feed)
  if n > feed_cap + math.floor(feed_cap / 10) then
    local gone = redis.call('XRANGE', feed, '-', '+', 'COUNT', n - feed_cap + 1)
    redis.call('XTRIM', feed, 'MINID', gone[#gone][1])
    redis.call('HSET', stamps, 'x', gone[#gone - 1][1])
  end
end
