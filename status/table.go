// Package status builds the tables Nodepool's operators know (node-list,
// request-list, label-list, image-list, dib-image-list, image-status) from
// the records of the buckets, and prints them as Nodepool does: a bordered
// plain-text table, or JSON objects keyed by field name. The CLI's list
// commands and the web API share it, so `nodepool list --fields` and
// `/node-list?fields=` print the same columns under the same names.
package status

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// Column is one field of a table: Key is its name in `fields` and in JSON
// (Nodepool's), Header its title in the text table.
type Column struct {
	Key    string
	Header string
}

// Cell is one value: JSON is what the JSON output holds, Text what the
// table shows.
type Cell struct {
	JSON any
	Text string
	// textJSON says JSON is Text: a string cell, made without putting
	// the string in an interface (an allocation for each cell of the
	// table shown, 1.2 million for 100,000 nodes).
	textJSON bool
}

// json is what the JSON output holds.
func (c Cell) json() any {
	if c.textJSON {
		return c.Text
	}
	return c.JSON
}

// Table is a list of records as columns and rows.
type Table struct {
	// Columns in their canonical order: every field the table has.
	Columns []Column
	// Default are the keys the CLI shows when no fields are asked for;
	// nil shows every column (the web API always does, as Nodepool's).
	Default []string
	// Rows hold one cell per column, in the order of Columns; or, for big
	// tables, N and At give the cells of the columns shown only.
	Rows [][]Cell
	N    int
	At   func(row, col int) Cell
}

func (t *Table) len() int {
	if t.At != nil {
		return t.N
	}
	return len(t.Rows)
}

func (t *Table) cell(row, col int) Cell {
	if t.At != nil {
		return t.At(row, col)
	}
	return t.Rows[row][col]
}

// ParseFields splits a comma separated list of fields ("id,state"),
// ignoring blanks.
func ParseFields(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Keys lists the keys of every column.
func (t *Table) Keys() []string {
	keys := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		keys[i] = c.Key
	}
	return keys
}

// Select returns the indexes of the columns named by fields, in that
// order; no fields selects every column. An unknown field is an error
// naming the fields there are.
func (t *Table) Select(fields []string) ([]int, error) {
	if len(fields) == 0 {
		idx := make([]int, len(t.Columns))
		for i := range idx {
			idx[i] = i
		}
		return idx, nil
	}
	keys := t.Keys()
	idx := make([]int, 0, len(fields))
	for _, f := range fields {
		i := slices.Index(keys, f)
		if i < 0 {
			return nil, fmt.Errorf("unknown field %q; expected some of: %s", f, strings.Join(keys, ", "))
		}
		idx = append(idx, i)
	}
	return idx, nil
}

// WriteText prints the table with the given fields (all if none) the way
// Nodepool's PrettyTable did: bordered, left aligned.
func (t *Table) WriteText(w io.Writer, fields []string) error {
	idx, err := t.Select(fields)
	if err != nil {
		return err
	}
	// The cells of the columns shown, row by row.
	n := t.len()
	cells := make([]string, n*len(idx))
	widths := make([]int, len(idx))
	for j, i := range idx {
		widths[j] = utf8.RuneCountInString(t.Columns[i].Header)
		for r := range n {
			s := t.cell(r, i).Text
			cells[r*len(idx)+j] = s
			widths[j] = max(widths[j], utf8.RuneCountInString(s))
		}
	}
	// Each line is as long as the rule (in runes), so the table's size is
	// known: one buffer, and padding written from a run of spaces
	// instead of a string made for each cell.
	var b bytes.Buffer
	lineLen := 2
	for _, wd := range widths {
		lineLen += wd + 3
	}
	b.Grow((n + 4) * (lineLen + 8))
	rule := func() {
		b.WriteByte('+')
		for _, wd := range widths {
			pad(&b, '-', wd+2)
			b.WriteByte('+')
		}
		b.WriteByte('\n')
	}
	line := func(cell func(j int) string) {
		b.WriteByte('|')
		for j := range idx {
			s := cell(j)
			b.WriteByte(' ')
			b.WriteString(s)
			pad(&b, ' ', widths[j]-utf8.RuneCountInString(s)+1)
			b.WriteByte('|')
		}
		b.WriteByte('\n')
	}
	rule()
	line(func(j int) string { return t.Columns[idx[j]].Header })
	rule()
	for r := range n {
		line(func(j int) string { return cells[r*len(idx)+j] })
	}
	rule()
	_, err = w.Write(b.Bytes())
	return err
}

// pad writes n times c (a space or a dash).
func pad(b *bytes.Buffer, c byte, n int) {
	const spaces, dashes = "                                                                ", "----------------------------------------------------------------"
	run := spaces
	if c == '-' {
		run = dashes
	}
	for n > 0 {
		k := min(n, len(run))
		b.WriteString(run[:k])
		n -= k
	}
}

// WriteJSON prints the rows as a JSON array of objects, each holding the
// given fields (all if none) in that order.
func (t *Table) WriteJSON(w io.Writer, fields []string) error {
	idx, err := t.Select(fields)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for r := range t.len() {
		if r > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('{')
		for j, i := range idx {
			if j > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(t.Columns[i].Key)
			v, err := json.Marshal(t.cell(r, i).json())
			if err != nil {
				return fmt.Errorf("field %s: %w", t.Columns[i].Key, err)
			}
			b.Write(k)
			b.WriteByte(':')
			b.Write(v)
		}
		b.WriteByte('}')
	}
	b.WriteString("]\n")
	_, err = w.Write(b.Bytes())
	return err
}
