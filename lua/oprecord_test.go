package lua

import (
	"strconv"
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestDecodeConsumeRecord: a well-formed record decodes; a damaged one is
// an error, never a Mutation with made-up numbers.
func TestDecodeConsumeRecord(t *testing.T) {
	const op = "0b0e7c9a-8d43-4a3f-9c59-3f3c8f6a1f10"
	good := "cabc\n" + op + "|1767225600000|1|5|15|10|5|90|3|0|api.calls"
	m, err := decodeConsumeRecord(good)
	if err != nil {
		t.Fatal(err)
	}
	if m.OpID.String() != op || m.AtMS != 1767225600000 || len(m.Entries) != 2 || m.Entries[1].Delta != -10 ||
		*m.Entries[1].Overage != 5 || m.Usage.Cost != 15 || m.Account.Balance != 90 || m.Account.Reserved != 3 ||
		m.RequestHash != "abc" || m.Entries[0].Role != "expiry" {
		t.Errorf("decoded %+v", m)
	}
	for _, bad := range []string{
		"", "c", "cabc", "xabc\n" + strings.TrimPrefix(good, "cabc\n"),
		"cabc\n" + op + "|1|1|5|15|10|5|90|3|0",                                              // a field short
		"cabc\nnot-a-uuid|1|0|5|15|10|5|90|3|0|m",                                            // op id
		"cabc\n" + op + "|1|0|5|1x|10|5|90|3|0|m",                                            // number
		"cabc\n" + op + "|1|-1|5|15|10|5|90|3|0|m",                                           // index
		"cabc\n" + op + "|1|" + strconv.Itoa(engine.MaxLiveBlocks+1) + "|5|15|10|5|90|3|0|m", // index past the blocks
		"cabc\n" + op + "|1|0|5|15|10|5|90|3|0|m|extra",                                      // a field long
		"cabc\n" + op + "|1|0|5|15|10|5|99999999999999999999|3|0|m",                          // past int64
	} {
		if _, err := decodeConsumeRecord(bad); err == nil {
			t.Errorf("decodeConsumeRecord(%q) = nil error", bad)
		}
	}
}
