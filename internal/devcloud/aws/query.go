package aws

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ec2Namespace is the XML namespace of EC2's responses (API 2016-11-15).
const ec2Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

// apiError is an error in EC2's (or another service's) terms: the code
// clients switch on, a message and the HTTP status it travels with.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func errf(status int, code, format string, args ...any) *apiError {
	return &apiError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func badParam(format string, args ...any) *apiError {
	return errf(http.StatusBadRequest, "InvalidParameterValue", format, args...)
}

func missing(name string) *apiError {
	return errf(http.StatusBadRequest, "MissingParameter", "The request must contain the parameter %s", name)
}

// form is the parameters of a Query-protocol request, with helpers for the
// protocol's flattened lists ("Filter.1.Name", "Filter.1.Value.1") and
// nested structures ("Placement.AvailabilityZone").
type form struct {
	v      url.Values
	prefix string
}

func (f form) key(name string) string {
	if f.prefix == "" {
		return name
	}
	return f.prefix + "." + name
}

// get returns a parameter ("" if absent).
func (f form) get(name string) string { return f.v.Get(f.key(name)) }

func (f form) has(name string) bool {
	_, ok := f.v[f.key(name)]
	return ok
}

// sub views a nested structure.
func (f form) sub(name string) form { return form{v: f.v, prefix: f.key(name)} }

// hasSub reports whether any parameter lies under a nested structure.
func (f form) hasSub(name string) bool {
	p := f.key(name) + "."
	for k := range f.v {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// indexes lists the member numbers of a flattened list, in order.
func (f form) indexes(name string) []int {
	p := f.key(name) + "."
	seen := map[int]bool{}
	for k := range f.v {
		rest, ok := strings.CutPrefix(k, p)
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ".")
		if i, err := strconv.Atoi(num); err == nil && i > 0 {
			seen[i] = true
		}
	}
	out := make([]int, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

// list returns a flattened list of strings ("InstanceId.1", "InstanceId.2").
func (f form) list(name string) []string {
	var out []string
	for _, i := range f.indexes(name) {
		if v, ok := f.v[f.key(name)+"."+strconv.Itoa(i)]; ok && len(v) > 0 {
			out = append(out, v[0])
		}
	}
	return out
}

// structs returns the members of a flattened list of structures.
func (f form) structs(name string) []form {
	var out []form
	for _, i := range f.indexes(name) {
		out = append(out, f.sub(name+"."+strconv.Itoa(i)))
	}
	return out
}

func (f form) int(name string, def int) (int, *apiError) {
	s := f.get(name)
	if s == "" {
		return def, nil
	}
	i, err := strconv.Atoi(s)
	if err != nil {
		return 0, badParam("Invalid value '%s' for %s. Expected an integer.", s, f.key(name))
	}
	return i, nil
}

func (f form) float(name string) (float64, *apiError) {
	s := f.get(name)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, badParam("Invalid value '%s' for %s. Expected a number.", s, f.key(name))
	}
	return v, nil
}

func (f form) bool(name string, def bool) (bool, *apiError) {
	switch strings.ToLower(f.get(name)) {
	case "":
		return def, nil
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, badParam("Invalid value '%s' for %s. Expected true or false.", f.get(name), f.key(name))
}

// tags reads a flattened list of Key/Value pairs.
func (f form) tags(name string) (map[string]string, *apiError) {
	out := map[string]string{}
	for _, t := range f.structs(name) {
		k := t.get("Key")
		if k == "" {
			return nil, badParam("Tag keys must not be empty (%s.Key)", t.prefix)
		}
		if strings.HasPrefix(strings.ToLower(k), "aws:") {
			return nil, badParam("Tag keys starting with 'aws:' are reserved for internal use")
		}
		if len(k) > 128 || len(t.get("Value")) > 256 {
			return nil, badParam("Tag keys are limited to 128 characters and values to 256")
		}
		out[k] = t.get("Value")
	}
	return out, nil
}

// tagSpecs reads TagSpecification.N (ResourceType, Tag.N) into tags per
// resource type.
func (f form) tagSpecs(name string, allowed ...string) (map[string]map[string]string, *apiError) {
	out := map[string]map[string]string{}
	for _, ts := range f.structs(name) {
		rt := ts.get("ResourceType")
		if rt == "" {
			return nil, missing(ts.key("ResourceType"))
		}
		if len(allowed) > 0 && !slices.Contains(allowed, rt) {
			return nil, badParam("'%s' is not a valid taggable resource type for this operation.", rt)
		}
		tags, err := ts.tags("Tag")
		if err != nil {
			return nil, err
		}
		if out[rt] == nil {
			out[rt] = map[string]string{}
		}
		for k, v := range tags {
			out[rt][k] = v
		}
	}
	return out, nil
}

// filter is one Filter.N of a Describe call.
type filter struct {
	name   string
	values []string
}

// maxFilterValues is EC2's limit of filter values in one call.
const maxFilterValues = 200

// filters reads Filter.N (or another name), refusing names the resource
// does not know.
func (f form) filters(name string, known func(string) bool) ([]filter, *apiError) {
	var out []filter
	values := 0
	for _, fs := range f.structs(name) {
		n := fs.get("Name")
		if n == "" {
			return nil, missing(fs.key("Name"))
		}
		if !strings.HasPrefix(n, "tag:") && !known(n) {
			return nil, badParam("The filter '%s' is invalid", n)
		}
		out = append(out, filter{name: n, values: fs.list("Value")})
		values += len(out[len(out)-1].values)
	}
	if values > maxFilterValues {
		return nil, errf(http.StatusBadRequest, "FilterLimitExceeded", "The maximum number of filter values specified on a single call is %d", maxFilterValues)
	}
	return out, nil
}

// knownFilters makes a known() for filters.
func knownFilters(names ...string) func(string) bool {
	return func(n string) bool { return slices.Contains(names, n) }
}

// match reports whether a value matches any of a filter's values; the
// values may hold the wildcards * and ?.
func (fl filter) match(vals ...string) bool {
	for _, want := range fl.values {
		for _, v := range vals {
			if ok, _ := path.Match(strings.ReplaceAll(want, "/", "\u2215"), strings.ReplaceAll(v, "/", "\u2215")); ok {
				return true
			}
		}
	}
	return false
}

// matchTags applies tag:K and tag-key filters; ok is false if the filter is
// not about tags.
func (fl filter) matchTags(tags map[string]string) (match, ok bool) {
	if k, isTag := strings.CutPrefix(fl.name, "tag:"); isTag {
		v, has := tags[k]
		return has && fl.match(v), true
	}
	switch fl.name {
	case "tag-key":
		for k := range tags {
			if fl.match(k) {
				return true, true
			}
		}
		return false, true
	case "tag-value":
		for _, v := range tags {
			if fl.match(v) {
				return true, true
			}
		}
		return false, true
	}
	return false, false
}

// page cuts a sorted list of ids into the page a request asks for: from
// NextToken, at most MaxResults (and the cloud's page size). The token is
// the id of the first item of the next page.
func page[T any](items []T, id func(T) string, f form, maxPage int, minResults int) ([]T, string, *apiError) {
	limit, err := f.int("MaxResults", 0)
	if err != nil {
		return nil, "", err
	}
	if f.has("MaxResults") && (limit < minResults || limit > 1000) {
		return nil, "", badParam("Value ( %d ) for parameter maxResults is invalid. Expecting a value between %d and 1000.", limit, minResults)
	}
	if limit == 0 || limit > maxPage {
		limit = maxPage
	}
	start := 0
	if tok := f.get("NextToken"); tok != "" {
		from, ok := decodeToken(tok)
		if !ok {
			return nil, "", errf(http.StatusBadRequest, "InvalidParameterValue", "The parameter NextToken is not valid")
		}
		start = sort.Search(len(items), func(i int) bool { return id(items[i]) >= from })
	}
	end := min(start+limit, len(items))
	next := ""
	if end < len(items) {
		next = encodeToken(id(items[end]))
	}
	return items[start:end], next, nil
}

func encodeToken(id string) string { return "tok-" + strconv.Quote(id)[1:len(strconv.Quote(id))-1] }

func decodeToken(tok string) (string, bool) {
	rest, ok := strings.CutPrefix(tok, "tok-")
	if !ok {
		return "", false
	}
	s, err := strconv.Unquote(`"` + rest + `"`)
	return s, err == nil
}

// ts is a timestamp as EC2 writes it: ISO 8601 with milliseconds, UTC.
type ts time.Time

func (t ts) MarshalText() ([]byte, error) {
	return []byte(time.Time(t).UTC().Format("2006-01-02T15:04:05.000Z")), nil
}

// items is a list as EC2 writes it: every member an <item>, and the list's
// element present even when empty.
type items[T any] []T

func (l items[T]) MarshalXML(e *xml.Encoder, start xml.StartElement) error {
	if err := e.EncodeToken(start); err != nil {
		return err
	}
	for _, it := range l {
		if err := e.EncodeElement(it, xml.StartElement{Name: xml.Name{Local: "item"}}); err != nil {
			return err
		}
	}
	return e.EncodeToken(start.End())
}

// tagSet writes tags as EC2 does, sorted by key.
func tagSet(tags map[string]string) items[xmlTag] {
	out := items[xmlTag]{}
	for k, v := range tags {
		out = append(out, xmlTag{Key: k, Value: v})
	}
	slices.SortFunc(out, func(a, b xmlTag) int { return strings.Compare(a.Key, b.Key) })
	return out
}

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

// meta is embedded first in every EC2 response body: its request id.
type meta struct {
	RequestID string `xml:"requestId"`
}

func (m *meta) setRequestID(id string) { m.RequestID = id }

// response is an EC2 response body (a struct embedding meta).
type response interface{ setRequestID(string) }

// writeEC2 writes a successful EC2 response: <ActionResponse> with the
// request id and the body's fields.
func writeEC2(w http.ResponseWriter, action, requestID string, body response) {
	body.setRequestID(requestID)
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(xml.Header))
	enc := xml.NewEncoder(w)
	start := xml.StartElement{Name: xml.Name{Local: action + "Response"}, Attr: []xml.Attr{{Name: xml.Name{Local: "xmlns"}, Value: ec2Namespace}}}
	if err := enc.EncodeElement(body, start); err != nil {
		return
	}
	_ = enc.Flush()
}

// writeEC2Error writes EC2's error envelope.
func writeEC2Error(w http.ResponseWriter, requestID string, err *apiError) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(err.Status)
	type xmlError struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	type response struct {
		XMLName   xml.Name   `xml:"Response"`
		Errors    []xmlError `xml:"Errors>Error"`
		RequestID string     `xml:"RequestID"`
	}
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(response{Errors: []xmlError{{Code: err.Code, Message: err.Message}}, RequestID: requestID})
}
