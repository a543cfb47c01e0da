package record

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestResources(t *testing.T) {
	a := Resources{Cores: 2, RAM: 4096, Instances: 1, Other: map[string]int{"L-1216C47A": 2}}
	b := Resources{Cores: 4, Instances: 1, Other: map[string]int{"L-34B43A08": 4}}
	sum := a.Add(b)
	if sum.Cores != 6 || sum.Other["L-1216C47A"] != 2 || sum.Other["L-34B43A08"] != 4 {
		t.Fatalf("Add: %+v", sum)
	}
	sum.Other["L-1216C47A"] = 99
	if a.Other["L-1216C47A"] != 2 {
		t.Fatal("Add aliased its operand's map")
	}
	if d := sum.Sub(b); d.Other["L-34B43A08"] != 0 || d.Cores != 2 {
		t.Fatalf("Sub: %+v", d)
	}
	// Less leaves resources the limit does not name unlimited.
	lim := Resources{Cores: 10, RAM: 100000, Instances: 5, Other: map[string]int{"L-1216C47A": 8}}
	left := lim.Less(a.Add(b))
	if left.Other["L-1216C47A"] != 6 || len(left.Other) != 1 || left.Cores != 4 {
		t.Fatalf("Less: %+v", left)
	}
	if (Resources{}).Less(a).Other != nil {
		t.Fatal("Less of a limit without other resources made some")
	}
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != `{"L-1216C47A":2,"cores":2,"instances":1,"ram":4096}` {
		t.Fatalf("JSON: %s", data)
	}
	var back Resources
	if err := json.Unmarshal(data, &back); err != nil || !reflect.DeepEqual(back, a) {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"cores":"x"}`), &back); err == nil {
		t.Fatal("a string value was taken")
	}
	var plain Resources
	if err := json.Unmarshal([]byte(`{"cores":1,"ram":2,"instances":1}`), &plain); err != nil || plain.Other != nil {
		t.Fatalf("plain: %+v %v", plain, err)
	}
}
