package engine

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"testing"
)

// TestSpecialPurposeRanges checks, for every range of the IANA IPv4 and IPv6
// special-purpose registries that webhooks may not reach, an address inside
// and, where one exists, the nearest address outside (IPv4-mapped and
// -compatible spellings included), and that every range in the table is
// covered here.
func TestSpecialPurposeRanges(t *testing.T) {
	cases := []struct {
		rng     string
		inside  []string
		outside []string
	}{
		{"0.0.0.0/8", []string{"0.0.0.0", "0.255.255.255"}, []string{"1.0.0.0"}},
		{"10.0.0.0/8", []string{"10.0.0.1", "10.255.255.255"}, []string{"9.255.255.255", "11.0.0.0"}},
		{"100.64.0.0/10", []string{"100.64.0.0", "100.127.255.255"}, []string{"100.63.255.255", "100.128.0.0"}},
		{"127.0.0.0/8", []string{"127.0.0.1", "127.255.255.254"}, []string{"126.255.255.255", "128.0.0.0"}},
		{"169.254.0.0/16", []string{"169.254.169.254"}, []string{"169.253.255.255", "169.255.0.0"}},
		{"172.16.0.0/12", []string{"172.16.0.1", "172.31.255.255"}, []string{"172.15.255.255", "172.32.0.0"}},
		{"192.0.0.0/24", []string{"192.0.0.8", "192.0.0.255"}, []string{"191.255.255.255", "192.0.1.0"}},
		{"192.0.2.0/24", []string{"192.0.2.1"}, []string{"192.0.1.255", "192.0.3.0"}},
		{"192.31.196.0/24", []string{"192.31.196.1"}, []string{"192.31.195.255", "192.31.197.0"}},
		{"192.52.193.0/24", []string{"192.52.193.1"}, []string{"192.52.192.255", "192.52.194.0"}},
		{"192.88.99.0/24", []string{"192.88.99.1"}, []string{"192.88.98.255", "192.88.100.0"}},
		{"192.168.0.0/16", []string{"192.168.1.1"}, []string{"192.167.255.255", "192.169.0.0"}},
		{"192.175.48.0/24", []string{"192.175.48.1"}, []string{"192.175.47.255", "192.175.49.0"}},
		{"198.18.0.0/15", []string{"198.18.0.1", "198.19.255.255"}, []string{"198.17.255.255", "198.20.0.0"}},
		{"198.51.100.0/24", []string{"198.51.100.7"}, []string{"198.51.99.255", "198.51.101.0"}},
		{"203.0.113.0/24", []string{"203.0.113.9"}, []string{"203.0.112.255", "203.0.114.0"}},
		// 239.255.255.255 is the top of 224/4; above it lies 240/4.
		{"224.0.0.0/4", []string{"224.0.0.1", "239.255.255.255"}, []string{"223.255.255.255"}},
		// 240/4 runs to the end of IPv4; below it lies 224/4.
		{"240.0.0.0/4", []string{"240.0.0.1", "255.255.255.254"}, nil},
		{"255.255.255.255/32", []string{"255.255.255.255"}, nil},

		{"::/128", []string{"::"}, nil},
		{"::1/128", []string{"::1"}, nil},
		{"::/96", []string{"::127.0.0.1", "::8.8.8.8", "::ffff:ffff"}, []string{"::1:0:0"}},
		{"64:ff9b::/96", []string{"64:ff9b::7f00:1", "64:ff9b::808:808"}, []string{"64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", "64:ff9b::1:0:0"}},
		{"64:ff9b:1::/48", []string{"64:ff9b:1::1", "64:ff9b:1:ffff::1"}, []string{"64:ff9b:0:ffff::1", "64:ff9b:2::"}},
		{"100::/64", []string{"100::1"}, []string{"ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "100:0:0:1::"}},
		{"2001::/23", []string{"2001::1", "2001:0:4136:e378::1", "2001:10::1", "2001:20::1", "2001:1ff:ffff::1"}, []string{"2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2001:200::1"}},
		{"2001:db8::/32", []string{"2001:db8::1"}, []string{"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db9::"}},
		{"2002::/16", []string{"2002:7f00:1::1"}, []string{"2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2003::1"}},
		{"2620:4f:8000::/48", []string{"2620:4f:8000::1"}, []string{"2620:4f:7fff:ffff:ffff:ffff:ffff:ffff", "2620:4f:8001::"}},
		{"3fff::/20", []string{"3fff::1", "3fff:fff:ffff::1"}, []string{"3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "3fff:1000::"}},
		{"5f00::/16", []string{"5f00::1"}, []string{"5eff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "5f01::"}},
		{"fc00::/7", []string{"fc00::1", "fd12:3456::1"}, []string{"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fe00::"}},
		// Above fe80::/10 lies fec0::/10.
		{"fe80::/10", []string{"fe80::1", "fe80::1%eth0", "febf::1"}, []string{"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
		// Between fe80::/10 and ff00::/8.
		{"fec0::/10", []string{"fec0::1", "feff::1"}, nil},
		{"ff00::/8", []string{"ff02::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}, nil},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.rng] = true
		for _, s := range c.inside {
			a := netip.MustParseAddr(s)
			if r, ok := SpecialPurpose(a); !ok {
				t.Errorf("%s (in %s) is allowed", s, c.rng)
			} else if a.Unmap().Is4() != r.Prefix.Addr().Is4() {
				t.Errorf("%s matched %s of the other family", s, r.Prefix)
			}
			// The IPv4-mapped spelling of an IPv4 address is the same address.
			if a.Is4() {
				if _, ok := SpecialPurpose(netip.AddrFrom16(a.As16())); !ok {
					t.Errorf("::ffff:%s (in %s) is allowed", s, c.rng)
				}
			}
		}
		for _, s := range c.outside {
			a := netip.MustParseAddr(s)
			if r, ok := SpecialPurpose(a); ok {
				t.Errorf("%s (just outside %s) is refused as %s", s, c.rng, r.Prefix)
			}
			if a.Is4() {
				if r, ok := SpecialPurpose(netip.AddrFrom16(a.As16())); ok {
					t.Errorf("::ffff:%s (just outside %s) is refused as %s", s, c.rng, r.Prefix)
				}
			}
		}
	}
	for _, r := range SpecialPurposeRanges {
		if !covered[r.Prefix.String()] {
			t.Errorf("range %s (%s) has no test row", r.Prefix, r.Name)
		}
	}
	// Ordinary public addresses of both families pass.
	for _, s := range []string{"8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2a00:1450:4001::1", "::ffff:93.184.216.34"} {
		if r, ok := SpecialPurpose(netip.MustParseAddr(s)); ok {
			t.Errorf("public %s refused as %s", s, r.Prefix)
		}
	}
	if _, ok := SpecialPurpose(netip.Addr{}); !ok {
		t.Error("the zero address is allowed")
	}
}

// TestCheckWebhookURL pins the check made when a URL is set: every
// special-purpose answer is a 422 naming url, public answers pass, and dev
// mode lets private addresses through.
func TestCheckWebhookURL(t *testing.T) {
	dns := map[string][]netip.Addr{
		"public.test":    {netip.MustParseAddr("93.184.216.34")},
		"cgn.test":       {netip.MustParseAddr("100.64.0.1")},
		"mixed.test":     {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("198.18.0.1")},
		"nat64.test":     {netip.MustParseAddr("64:ff9b::7f00:1")},
		"broadcast.test": {netip.MustParseAddr("255.255.255.255")},
	}
	s := NewTenants(nil, nil, SystemClock{}, false)
	s.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
		if a, err := netip.ParseAddr(host); err == nil {
			return []netip.Addr{a}, nil
		}
		if a, ok := dns[host]; ok {
			return a, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	cases := []struct {
		url string
		ok  bool
	}{
		{"https://public.test/hooks", true},
		{"http://93.184.216.34:8080/", true},
		{"https://[2606:4700:4700::1111]/", true},
		{"https://cgn.test/", false},
		{"https://mixed.test/", false},
		{"https://nat64.test/", false},
		{"https://broadcast.test/", false},
		{"http://[::127.0.0.1]/", false},
		{"http://[::ffff:127.0.0.1]/", false},
		{"http://[fe80::1%25eth0]/", false},
		{"http://0.0.0.0:80/", false},
		{"http://198.18.0.1/", false},
		{"https://nowhere.test/", false},
	}
	for _, c := range cases {
		u, perr := url.Parse(c.url)
		if perr != nil {
			t.Fatal(perr)
		}
		err := s.checkWebhookHost(context.Background(), u.Hostname())
		if c.ok != (err == nil) {
			t.Errorf("%s: err = %v, want ok %v", c.url, err, c.ok)
			continue
		}
		var e *Error
		if err != nil && (!errors.As(err, &e) || e.Kind != KindValidation || e.Field != "url") {
			t.Errorf("%s: err = %v, want a 422 naming url", c.url, err)
		}
	}
	dev := NewTenants(nil, nil, SystemClock{}, true)
	if err := dev.checkWebhookHost(context.Background(), "127.0.0.1"); err != nil {
		t.Errorf("dev mode refuses loopback: %v", err)
	}
}
