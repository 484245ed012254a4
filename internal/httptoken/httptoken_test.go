package httptoken

import "testing"

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"Authorization": true, "X-Pace-Tenant": true, "x-api-key": true, "GET": true, "PATCH": true, "!#$%&'*+-.^_`|~09az": true,
		"": false, "X Class": false, "a:b": false, "{x}": false, "X-Ünicode": false, "a\tb": false, "a\x7f": false, `"quoted"`: false, "a/b": false,
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}
