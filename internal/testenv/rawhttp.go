package testenv

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// HeadOnly sends head (a request line and headers, no body) on a fresh
// connection to addr and reads the answer, which the server must send
// before any body arrives: a server that waited for the body would make it
// fail after 2 s instead.
func HeadOnly(t *testing.T, addr, head string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer before the body was sent: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, body
}
