package status

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Age prints how long ago t was as Nodepool did: days:hours:minutes:seconds,
// each two digits ("00:01:02:03").
func Age(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	s := int64(max(now.Sub(t), 0) / time.Second)
	var buf [16]byte
	b := buf[:0]
	for i, v := range [4]int64{s / 86400, s / 3600 % 24, s / 60 % 60, s % 60} {
		if i > 0 {
			b = append(b, ':')
		}
		if v < 10 {
			b = append(b, '0')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	return string(b)
}

func text(s string) Cell { return Cell{Text: s, textJSON: true} }

func list(ss []string) Cell {
	if ss == nil {
		ss = []string{}
	}
	return Cell{JSON: ss, Text: strings.Join(ss, ",")}
}

func number(n int) Cell {
	return Cell{JSON: n, Text: strconv.Itoa(n)}
}

// boolean prints as Python did (True, False).
func boolean(b bool) Cell {
	if b {
		return Cell{JSON: true, Text: "True"}
	}
	return Cell{JSON: false, Text: "False"}
}

// age is an age both in the table and in JSON (node-list's, as Nodepool's).
func age(t, now time.Time) Cell { return text(Age(t, now)) }

// stamp is an age in the table and a Unix time in JSON (the image lists',
// as Nodepool's).
func stamp(t, now time.Time) Cell {
	if t.IsZero() {
		return Cell{JSON: nil, Text: ""}
	}
	return Cell{JSON: t.Unix(), Text: Age(t, now)}
}

func timeOf(t *time.Time) Cell {
	if t == nil || t.IsZero() {
		return Cell{JSON: nil, Text: ""}
	}
	return text(t.UTC().Format(time.RFC3339))
}

func raw(data json.RawMessage) Cell {
	if len(data) == 0 || string(data) == "null" {
		return Cell{JSON: nil, Text: ""}
	}
	// The record was decoded from JSON: its raw parts are valid JSON.
	return Cell{JSON: data, Text: string(data)}
}

// size is a byte count: exact in JSON, readable in the table.
func size(n int64) Cell {
	return Cell{JSON: n, Text: HumanSize(n)}
}

// HumanSize prints a byte count with a binary unit (1.5GiB).
func HumanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
