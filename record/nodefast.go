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
// list`). It reports false for anything else: a string with an escape, a member it does not know, a member named twice,
// a time not in UTC, a number that is not a plain integer, a kubernetes
// member that is not null, a syntax error. Unmarshal then reads the
// record with the general decoder, which reads the rest and says what is
// wrong (n may then hold part of the record: Unmarshal makes it zero
// first). What it reads, it reads as the general decoder does
// (FuzzDecodeNodeAsTheGeneralDecoder).
func decodeNode(data []byte, n *Node) bool {
	s := scanner{b: data}
	if !s.node(n) {
		return false
	}
	s.ws()
	return s.i == len(s.b)
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

// nodeMember is how a member of a node record is read: its bit in
// scanner.node's seen, and the function that reads its value into the
// node. Values many nodes share (a provider, a pool, a user name) are kept
// once in the process (unique.Make) instead of once a node: the second
// argument of stringValue and strings.
type nodeMember struct {
	bit  int
	read func(s *scanner, n *Node) bool
}

// nodeMembers are the members of a node record, by name (a table read
// only).
var nodeMembers = map[string]nodeMember{
	"id":              {mID, func(s *scanner, n *Node) bool { return s.stringValue(&n.ID, false) }},
	"provider":        {mProvider, func(s *scanner, n *Node) bool { return s.stringValue(&n.Provider, true) }},
	"pool":            {mPool, func(s *scanner, n *Node) bool { return s.stringValue(&n.Pool, true) }},
	"cloud":           {mCloud, func(s *scanner, n *Node) bool { return s.stringValue(&n.Cloud, true) }},
	"region":          {mRegion, func(s *scanner, n *Node) bool { return s.stringValue(&n.Region, true) }},
	"az":              {mAZ, func(s *scanner, n *Node) bool { return s.stringValue(&n.AZ, true) }},
	"external_id":     {mExternalID, func(s *scanner, n *Node) bool { return s.stringValue(&n.ExternalID, false) }},
	"hostname":        {mHostname, func(s *scanner, n *Node) bool { return s.stringValue(&n.Hostname, false) }},
	"interface_ip":    {mInterfaceIP, func(s *scanner, n *Node) bool { return s.stringValue(&n.InterfaceIP, false) }},
	"public_ipv4":     {mPublicIPv4, func(s *scanner, n *Node) bool { return s.stringValue(&n.PublicIPv4, false) }},
	"private_ipv4":    {mPrivateIPv4, func(s *scanner, n *Node) bool { return s.stringValue(&n.PrivateIPv4, false) }},
	"public_ipv6":     {mPublicIPv6, func(s *scanner, n *Node) bool { return s.stringValue(&n.PublicIPv6, false) }},
	"connection_type": {mConnectionType, func(s *scanner, n *Node) bool { return s.stringValue(&n.ConnectionType, true) }},
	"username":        {mUsername, func(s *scanner, n *Node) bool { return s.stringValue(&n.Username, true) }},
	"python_path":     {mPythonPath, func(s *scanner, n *Node) bool { return s.stringValue(&n.PythonPath, true) }},
	"shell_type":      {mShellType, func(s *scanner, n *Node) bool { return s.stringValue(&n.ShellType, true) }},
	"image_id":        {mImageID, func(s *scanner, n *Node) bool { return s.stringValue(&n.ImageID, true) }},
	"allocated_to":    {mAllocatedTo, func(s *scanner, n *Node) bool { return s.stringValue(&n.AllocatedTo, false) }},
	"holder":          {mHolder, func(s *scanner, n *Node) bool { return s.stringValue(&n.Holder, true) }},
	"launcher":        {mLauncher, func(s *scanner, n *Node) bool { return s.stringValue(&n.Launcher, true) }},
	"hold_job":        {mHoldJob, func(s *scanner, n *Node) bool { return s.stringValue(&n.HoldJob, true) }},
	"comment":         {mComment, func(s *scanner, n *Node) bool { return s.stringValue(&n.Comment, false) }},
	"tenant":          {mTenant, func(s *scanner, n *Node) bool { return s.stringValue(&n.Tenant, true) }},
	"requestor":       {mRequestor, func(s *scanner, n *Node) bool { return s.stringValue(&n.Requestor, true) }},
	"reason":          {mReason, func(s *scanner, n *Node) bool { return s.stringValue(&n.Reason, true) }},
	"instance_down":   {mInstanceDown, func(s *scanner, n *Node) bool { return s.stringValue(&n.InstanceDown, true) }},
	"owner":           {mOwner, func(s *scanner, n *Node) bool { return s.stringValue(&n.Owner, true) }},
	"zookeeper_id":    {mZooKeeperID, func(s *scanner, n *Node) bool { return s.stringValue(&n.ZooKeeperID, false) }},
	"state": {mState, func(s *scanner, n *Node) bool {
		var v string
		ok := s.stringValue(&v, true)
		n.State = NodeState(v)
		return ok
	}},
	"labels":          {mLabels, func(s *scanner, n *Node) bool { return s.strings(&n.Labels, true) }},
	"host_keys":       {mHostKeys, func(s *scanner, n *Node) bool { return s.strings(&n.HostKeys, false) }},
	"connection_port": {mConnectionPort, func(s *scanner, n *Node) bool { return s.int(&n.ConnectionPort) }},
	"attempt":         {mAttempt, func(s *scanner, n *Node) bool { return s.int(&n.Attempt) }},
	"lease_until":     {mLeaseUntil, func(s *scanner, n *Node) bool { return s.timePtr(&n.LeaseUntil) }},
	"hold_expiration": {mHoldExpiration, func(s *scanner, n *Node) bool { return s.timePtr(&n.HoldExpiration) }},
	"created":         {mCreated, func(s *scanner, n *Node) bool { return s.time(&n.Created) }},
	"state_time":      {mStateTime, func(s *scanner, n *Node) bool { return s.time(&n.StateTime) }},
	"resources":       {mResources, func(s *scanner, n *Node) bool { return s.resources(&n.Resources) }},
	"attributes":      {mAttributes, func(s *scanner, n *Node) bool { return s.attributes(&n.Attributes) }},
	"driver_data":     {mDriverData, func(s *scanner, n *Node) bool { return s.raw((*[]byte)(&n.DriverData)) }},
	"user_data":       {mUserData, func(s *scanner, n *Node) bool { return s.raw((*[]byte)(&n.UserData)) }},
	// An object: the general decoder reads it.
	"kubernetes": {mKubernetes, func(s *scanner, _ *Node) bool { return s.null() }},
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
		m, known := nodeMembers[string(name)]
		if !known || seen&(1<<m.bit) != 0 || !m.read(s, n) {
			return false
		}
		seen |= 1 << m.bit
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
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
	if len(v) < 20 || !bytes.Equal([]byte{v[4], v[7], v[10], v[13], v[16]}, []byte("--T::")) || v[len(v)-1] != 'Z' {
		return time.Time{}, false
	}
	// year, month, day, hour, minute, second: where each starts and ends
	var f [6]int
	for i, at := range [...][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}} {
		n, ok := decimal(v[at[0]:at[1]])
		if !ok {
			return time.Time{}, false
		}
		f[i] = n
	}
	nsec, ok := fraction(v[19 : len(v)-1])
	if !ok || !inRange(f) {
		return time.Time{}, false
	}
	return time.Date(f[0], time.Month(f[1]), f[2], f[3], f[4], f[5], nsec, time.UTC), true
}

// inRange reports whether a year, month, day, hour, minute and second
// are a time there is.
func inRange(f [6]int) bool {
	return f[1] >= 1 && f[1] <= 12 && f[2] >= 1 && f[2] <= daysIn(f[1], f[0]) && f[3] <= 23 && f[4] <= 59 && f[5] <= 59
}

// decimal reads digits.
func decimal(b []byte) (int, bool) {
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// fraction reads a fraction of a second (".5", ".123456789", or nothing)
// as nanoseconds.
func fraction(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, true
	}
	if b[0] != '.' || len(b) < 2 || len(b) > 10 {
		return 0, false
	}
	f, ok := decimal(b[1:])
	for range 10 - len(b) {
		f *= 10
	}
	return f, ok
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
		if !ok || !s.next(':') || !s.resource(&out, &seen, name) {
			return false
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

// resource reads the value of one member of a node's resources into r;
// seen has a bit for each of cores, ram and instances read.
func (s *scanner) resource(r *Resources, seen *uint8, name []byte) bool {
	var p *int
	var bit uint8
	switch string(name) {
	case "cores":
		p, bit = &r.Cores, 1
	case "ram":
		p, bit = &r.RAM, 2
	case "instances":
		p, bit = &r.Instances, 4
	default:
		var v int
		if _, dup := r.Other[string(name)]; dup || !s.int(&v) {
			return false
		}
		if r.Other == nil {
			r.Other = map[string]int{}
		}
		r.Other[text(name, true)] = v
		return true
	}
	if *seen&bit != 0 || !s.int(p) {
		return false
	}
	*seen |= bit
	return true
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
