package engine

import "net/netip"

// SpecialRange is one entry of the IANA IPv4 or IPv6 Special-Purpose
// Address Registry (plus the address blocks the registries point at) that
// webhook deliveries must never reach.
type SpecialRange struct {
	Prefix netip.Prefix
	Name   string
}

// SpecialPurposeRanges is every range a webhook URL may not resolve to
// unless CREDITD_WEBHOOK_ALLOW_PRIVATE is set. Both the check when the URL is
// set and the sender's dialer (every connect) use this table, so a range is
// added in one place. IPv4-mapped IPv6 addresses (::ffff:0:0/96) are not
// listed: they are checked by the IPv4 address they carry.
var SpecialPurposeRanges = []SpecialRange{
	// IPv4 (RFC 6890 and the registry's later entries).
	{netip.MustParsePrefix("0.0.0.0/8"), "this network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private-use"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGN)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private-use"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation (TEST-NET-1)"},
	{netip.MustParsePrefix("192.31.196.0/24"), "AS112-v4"},
	{netip.MustParsePrefix("192.52.193.0/24"), "AMT"},
	{netip.MustParsePrefix("192.88.99.0/24"), "deprecated 6to4 relay anycast"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private-use"},
	{netip.MustParsePrefix("192.175.48.0/24"), "direct delegation AS112"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation (TEST-NET-2)"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation (TEST-NET-3)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("255.255.255.255/32"), "limited broadcast"},

	// IPv6.
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated)"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64 well-known prefix"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "NAT64 local-use"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("2001::/23"), "IETF protocol assignments (Teredo, ORCHIDv2, ...)"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("2002::/16"), "6to4"},
	{netip.MustParsePrefix("2620:4f:8000::/48"), "direct delegation AS112"},
	{netip.MustParsePrefix("3fff::/20"), "documentation"},
	{netip.MustParsePrefix("5f00::/16"), "segment routing (SRv6) SIDs"},
	{netip.MustParsePrefix("fc00::/7"), "unique local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// SpecialPurpose reports whether a is in a special-purpose range, and which.
// An IPv4-mapped IPv6 address is judged by the IPv4 address it carries (the
// kernel connects to that address); a zone is ignored.
func SpecialPurpose(a netip.Addr) (SpecialRange, bool) {
	if !a.IsValid() {
		return SpecialRange{Name: "invalid address"}, true
	}
	a = a.WithZone("").Unmap()
	for _, r := range SpecialPurposeRanges {
		if r.Prefix.Contains(a) {
			return r, true
		}
	}
	return SpecialRange{}, false
}
