package manifest

import (
	"encoding/json"
	"testing"

	kjson "sigs.k8s.io/json"
)

// locateTarget is a type for TestLocate: a struct, a list of structs, a
// map, and a field that decodes itself.
type locateTarget struct {
	Name  string            `json:"name"`
	Items []locateItem      `json:"items"`
	Tags  map[string]string `json:"tags"`
	Raw   json.RawMessage   `json:"raw"`
}

type locateItem struct {
	N   int32  `json:"n"`
	Sub []bool `json:"sub"`
}

func TestLocate(t *testing.T) {
	decode := func(v any) error {
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		return kjson.UnmarshalCaseSensitivePreserveInts(data, &locateTarget{})
	}
	for _, tc := range []struct {
		name, in, want string
	}{
		{name: "nothing wrong", in: `{"name": "a", "items": [{"n": 1}], "raw": {"x": [1]}}`, want: "-"},
		{name: "a leaf", in: `{"name": 1}`, want: "name"},
		{name: "a list where an object belongs", in: `{"items": [[{"n": 1}]]}`, want: "items[0]"},
		{name: "an object where a list belongs", in: `{"items": {"n": 1}}`, want: "items"},
		{name: "an item after good ones", in: `{"items": [{"n": 1}, {"n": 2, "sub": [true]}, {"sub": [false, "x"]}]}`, want: "items[2].sub[1]"},
		{name: "out of range", in: `{"items": [{"n": 1}, {"n": 2147483648}]}`, want: "items[1].n"},
		{name: "a map value", in: `{"tags": {"a": "b", "c.d/e": {}}}`, want: `tags["c.d/e"]`},
		{name: "the first bad value in key order", in: `{"tags": {"a": 1}, "name": 2, "items": 3}`, want: "items"},
		{name: "anything in a raw field", in: `{"raw": {"items": 3}, "name": null}`, want: "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in any
			if err := json.Unmarshal([]byte(tc.in), &in); err != nil {
				t.Fatal(err)
			}
			got, err := locate(in, decode)
			switch {
			case tc.want == "-" && err != nil:
				t.Errorf("locate(%s) = %q, %v; want no error", tc.in, got, err)
			case tc.want != "-" && (err == nil || got != tc.want):
				t.Errorf("locate(%s) = %q, %v; want %q and an error", tc.in, got, err, tc.want)
			}
		})
	}
}
