package record

import (
	"bytes"
	"time"
	"unicode/utf8"
	"unique"

	"github.com/go-json-experiment/json/jsontext"
)

// decodeNode reads a node record written the way the launcher, the
// bridges and encoding/json write one, a byte at a time, without the
// general decoder's tokens (which are most of the time it takes: 100,000
// records are read at every start of a launcher and by every `nodepool
// list`). It reports false, leaving n as it was, for anything else: a
// string with an escape, a member it does not know, a member named twice,
// a time not in UTC, a number that is not a plain integer, a kubernetes
// member that is not null, a syntax error. Unmarshal then reads the
// record with the general decoder, which reads the rest and says what is
// wrong. What it reads, it reads as the general decoder does
// (FuzzDecodeNodeAsTheGeneralDecoder).
func decodeNode(data []byte, n *Node) bool {
	s := scanner{b: data}
	var out Node
	if !s.node(&out) {
		return false
	}
	s.ws()
	if s.i != len(s.b) {
		return false
	}
	*n = out
	return true
}

// The members of a node record, by their bit in scanner.node's seen.
const (
	mID = iota
	mState
	mLabels
	mProvider
	mPool
	mCloud
	mRegion
	mAZ
	mExternalID
	mHostname
	mInterfaceIP
	mPublicIPv4
	mPrivateIPv4
	mPublicIPv6
	mConnectionType
	mConnectionPort
	mUsername
	mPythonPath
	mShellType
	mHostKeys
	mImageID
	mAllocatedTo
	mHolder
	mLeaseUntil
	mLauncher
	mHoldJob
	mHoldExpiration
	mComment
	mResources
	mAttributes
	mDriverData
	mUserData
	mTenant
	mRequestor
	mCreated
	mStateTime
	mReason
	mInstanceDown
	mAttempt
	mOwner
	mZooKeeperID
	mKubernetes
)

// stringMember is where a member whose value is a string goes, and
// whether the value is one many nodes share (a provider, a pool, a user
// name), kept once in the process (unique.Make) instead of once a node.
func stringMember(n *Node, name []byte) (p *string, bit int, shared bool) {
	switch string(name) {
	case "id":
		return &n.ID, mID, false
	case "provider":
		return &n.Provider, mProvider, true
	case "pool":
		return &n.Pool, mPool, true
	case "cloud":
		return &n.Cloud, mCloud, true
	case "region":
		return &n.Region, mRegion, true
	case "az":
		return &n.AZ, mAZ, true
	case "external_id":
		return &n.ExternalID, mExternalID, false
	case "hostname":
		return &n.Hostname, mHostname, false
	case "interface_ip":
		return &n.InterfaceIP, mInterfaceIP, false
	case "public_ipv4":
		return &n.PublicIPv4, mPublicIPv4, false
	case "private_ipv4":
		return &n.PrivateIPv4, mPrivateIPv4, false
	case "public_ipv6":
		return &n.PublicIPv6, mPublicIPv6, false
	case "connection_type":
		return &n.ConnectionType, mConnectionType, true
	case "username":
		return &n.Username, mUsername, true
	case "python_path":
		return &n.PythonPath, mPythonPath, true
	case "shell_type":
		return &n.ShellType, mShellType, true
	case "image_id":
		return &n.ImageID, mImageID, true
	case "allocated_to":
		return &n.AllocatedTo, mAllocatedTo, false
	case "holder":
		return &n.Holder, mHolder, true
	case "launcher":
		return &n.Launcher, mLauncher, true
	case "hold_job":
		return &n.HoldJob, mHoldJob, true
	case "comment":
		return &n.Comment, mComment, false
	case "tenant":
		return &n.Tenant, mTenant, true
	case "requestor":
		return &n.Requestor, mRequestor, true
	case "reason":
		return &n.Reason, mReason, true
	case "instance_down":
		return &n.InstanceDown, mInstanceDown, true
	case "owner":
		return &n.Owner, mOwner, true
	case "zookeeper_id":
		return &n.ZooKeeperID, mZooKeeperID, false
	}
	return nil, -1, false
}

// node reads the object of a node record into n.
func (s *scanner) node(n *Node) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	var seen uint64
	for {
		name, ok := s.str()
		if !ok || !s.next(':') {
			return false
		}
		bit, ok := s.member(n, name)
		if !ok || seen&(1<<bit) != 0 {
			return false
		}
		seen |= 1 << bit
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// member reads the value of the member name into n, and says which member
// it was.
func (s *scanner) member(n *Node, name []byte) (int, bool) {
	if p, bit, shared := stringMember(n, name); p != nil {
		return bit, s.stringValue(p, shared)
	}
	switch string(name) {
	case "state":
		var v string
		ok := s.stringValue(&v, true)
		n.State = NodeState(v)
		return mState, ok
	case "labels":
		return mLabels, s.strings(&n.Labels, true)
	case "host_keys":
		return mHostKeys, s.strings(&n.HostKeys, false)
	case "connection_port":
		return mConnectionPort, s.int(&n.ConnectionPort)
	case "attempt":
		return mAttempt, s.int(&n.Attempt)
	case "lease_until":
		return mLeaseUntil, s.timePtr(&n.LeaseUntil)
	case "hold_expiration":
		return mHoldExpiration, s.timePtr(&n.HoldExpiration)
	case "created":
		return mCreated, s.time(&n.Created)
	case "state_time":
		return mStateTime, s.time(&n.StateTime)
	case "resources":
		return mResources, s.resources(&n.Resources)
	case "attributes":
		return mAttributes, s.attributes(&n.Attributes)
	case "driver_data":
		return mDriverData, s.raw((*[]byte)(&n.DriverData))
	case "user_data":
		return mUserData, s.raw((*[]byte)(&n.UserData))
	case "kubernetes":
		return mKubernetes, s.null() // an object: the general decoder reads it
	}
	return 0, false
}

// scanner reads JSON from b at i.
type scanner struct {
	b []byte
	i int
	// recent are the last strings read that are not shared: a node's
	// addresses are often one address three times, kept once (as the
	// general decoder's cache of strings does).
	recent [4]string
	slot   int
}

// ws skips whitespace.
func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next takes c, after whitespace, if it comes next.
func (s *scanner) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// null takes null if it comes next.
func (s *scanner) null() bool {
	s.ws()
	if bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// str reads a string without escapes (valid UTF-8, no control
// characters) and returns its bytes, which alias b.
func (s *scanner) str() ([]byte, bool) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	start := s.i + 1
	end := bytes.IndexByte(s.b[start:], '"')
	if end < 0 {
		return nil, false
	}
	v := s.b[start : start+end]
	ascii := true
	for _, c := range v {
		if c < 0x20 || c == '\\' {
			return nil, false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(v) {
		return nil, false
	}
	s.i = start + end + 1
	return v, true
}

// stringValue reads a string, or null (which leaves p as it is); shared:
// see stringMember.
func (s *scanner) stringValue(p *string, shared bool) bool {
	if s.null() {
		return true
	}
	v, ok := s.str()
	switch {
	case !ok:
	case shared:
		*p = text(v, true)
	default:
		*p = s.own(v)
	}
	return ok
}

// text is v as a string; shared, kept once in the process for every node
// that has it (unique.Make, which allocates nothing for a value it
// holds).
func text(v []byte, shared bool) string {
	if shared {
		return unique.Make(string(v)).Value()
	}
	return string(v)
}

// own is v as a string of this record: the same string as one of the
// last read, if v is.
func (s *scanner) own(v []byte) string {
	for _, r := range s.recent {
		if r == string(v) && r != "" {
			return r
		}
	}
	str := string(v)
	s.recent[s.slot%len(s.recent)] = str
	s.slot++
	return str
}

// strings reads an array of strings, or null; shared: see stringMember.
func (s *scanner) strings(p *[]string, shared bool) bool {
	if s.null() {
		*p = nil
		return true
	}
	if !s.next('[') {
		return false
	}
	out := []string{}
	if s.next(']') {
		*p = out
		return true
	}
	for {
		v, ok := s.str()
		if !ok {
			return false
		}
		out = append(out, text(v, shared))
		if s.next(']') {
			*p = out
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// int reads an integer written as JSON writes one (no fraction, no
// exponent, no leading zero), of at most 18 digits.
func (s *scanner) int(p *int) bool {
	s.ws()
	j := s.i
	neg := j < len(s.b) && s.b[j] == '-'
	if neg {
		j++
	}
	start := j
	v := 0
	for ; j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9'; j++ {
		v = v*10 + int(s.b[j]-'0')
	}
	digits := j - start
	if digits == 0 || digits > 18 || (digits > 1 && s.b[start] == '0') {
		return false
	}
	if j < len(s.b) && (s.b[j] == '.' || s.b[j] == 'e' || s.b[j] == 'E') {
		return false
	}
	if neg {
		v = -v
	}
	*p, s.i = v, j
	return true
}

// time reads a time in UTC as RFC 3339 writes it
// (2006-01-02T15:04:05.999999999Z), or null (which leaves p as it is).
func (s *scanner) time(p *time.Time) bool {
	if s.null() {
		return true
	}
	v, ok := s.str()
	if !ok {
		return false
	}
	t, ok := parseUTC(v)
	if ok {
		*p = t
	}
	return ok
}

// timePtr reads a time as time does, or null (nil).
func (s *scanner) timePtr(p **time.Time) bool {
	if s.null() {
		*p = nil
		return true
	}
	var t time.Time
	if !s.time(&t) {
		return false
	}
	*p = &t
	return true
}

// parseUTC parses 2006-01-02T15:04:05Z with 0 to 9 digits of fraction,
// each field in its range (a day of the month that month has).
func parseUTC(v []byte) (time.Time, bool) {
	if len(v) < 20 || v[4] != '-' || v[7] != '-' || v[10] != 'T' || v[13] != ':' || v[16] != ':' || v[len(v)-1] != 'Z' {
		return time.Time{}, false
	}
	num := func(b []byte) (int, bool) {
		n := 0
		for _, c := range b {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(v[0:4])
	month, ok2 := num(v[5:7])
	day, ok3 := num(v[8:10])
	hour, ok4 := num(v[11:13])
	minute, ok5 := num(v[14:16])
	sec, ok6 := num(v[17:19])
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 {
		return time.Time{}, false
	}
	nsec := 0
	if frac := v[19 : len(v)-1]; len(frac) > 0 {
		if frac[0] != '.' || len(frac) < 2 || len(frac) > 10 {
			return time.Time{}, false
		}
		f, ok := num(frac[1:])
		if !ok {
			return time.Time{}, false
		}
		for range 10 - len(frac) {
			f *= 10
		}
		nsec = f
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), true
}

func daysIn(month, year int) int {
	if month == 2 {
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	}
	return 31 - (month-1)%7%2
}

// resources reads a node's resources (cores, ram, instances and the other
// resources, each an integer), or null.
func (s *scanner) resources(r *Resources) bool {
	if s.null() {
		*r = Resources{}
		return true
	}
	if !s.next('{') {
		return false
	}
	var out Resources
	if s.next('}') {
		*r = out
		return true
	}
	var seen uint8
	for {
		name, ok := s.str()
		if !ok || !s.next(':') {
			return false
		}
		var p *int
		var bit uint8
		switch string(name) {
		case "cores":
			p, bit = &out.Cores, 1
		case "ram":
			p, bit = &out.RAM, 2
		case "instances":
			p, bit = &out.Instances, 4
		default:
			if _, dup := out.Other[string(name)]; dup {
				return false
			}
			var v int
			if !s.int(&v) {
				return false
			}
			if out.Other == nil {
				out.Other = map[string]int{}
			}
			out.Other[text(name, true)] = v
		}
		if p != nil {
			if seen&bit != 0 || !s.int(p) {
				return false
			}
			seen |= bit
		}
		if s.next('}') {
			*r = out
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// attributes reads an object of strings, or null.
func (s *scanner) attributes(p *map[string]string) bool {
	if s.null() {
		*p = nil
		return true
	}
	if !s.next('{') {
		return false
	}
	out := map[string]string{}
	if s.next('}') {
		*p = out
		return true
	}
	for {
		name, ok := s.str()
		if !ok || !s.next(':') {
			return false
		}
		if _, dup := out[string(name)]; dup {
			return false
		}
		v, ok := s.str()
		if !ok {
			return false
		}
		out[text(name, true)] = text(v, true)
		if s.next('}') {
			*p = out
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// raw reads any JSON value (null included) as its bytes, copied.
func (s *scanner) raw(p *[]byte) bool {
	s.ws()
	start, depth := s.i, 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			// Past the string: its escapes are skipped whole, so that an
			// escaped quote does not end it.
			j := s.i + 1
			for j < len(s.b) && s.b[j] != '"' {
				if s.b[j] == '\\' {
					j++
				}
				j++
			}
			s.i = j
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return s.rawEnd(p, start)
			}
			depth--
			if depth == 0 {
				s.i++
				return s.rawEnd(p, start)
			}
		case ',':
			if depth == 0 {
				return s.rawEnd(p, start)
			}
		}
		s.i++
	}
	return false
}

// rawEnd ends a raw value at i: valid JSON (jsontext's own check), less
// the whitespace after it.
func (s *scanner) rawEnd(p *[]byte, start int) bool {
	v := bytes.TrimRight(s.b[start:min(s.i, len(s.b))], " \t\n\r")
	if len(v) == 0 || !jsontext.Value(v).IsValid() {
		return false
	}
	*p = bytes.Clone(v)
	return true
}
