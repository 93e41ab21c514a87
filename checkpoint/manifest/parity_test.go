package manifest

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// Go's Parse and the Python helper's _parse_manifest accept and refuse the
// same manifests (hostile ones included): the two verifiers must never
// disagree on which step is consistent.
func TestParseAgreesWithPython(t *testing.T) {
	py := python3(t)
	sha := strings.Repeat("a", 64)
	base := `"version":1,"step":3,"files":[{"path":"a","size":1,"sha256":"` + sha + `"}],"savedAt":"2026-11-30T05:00:00Z"`
	rank := `,"rank":1,"worldSize":2`
	var cases []string
	for _, extra := range []string{
		``, rank, rank + `,"runId":"r-1"`, rank + `,"runId":""`, rank + `,"runId":null`, rank + `,"runId":"a b"`,
		rank + `,"runId":7`, `,"runId":"single"`, rank + `,"jobId":"j-1"`, rank + `,"jobId":""`, rank + `,"jobId":5`,
		`,"rank":null,"worldSize":null`, `,"rank":0`, rank + `,"tier":"local","node":"n","localWorldSize":1`,
		rank + `,"tier":""`, rank + `,"tier":null`, rank + `,"tier":"nvme"`, rank + `,"tier":"shared"`,
		rank + `,"node":""`, rank + `,"node":null`, rank + `,"node":"a\nb"`, rank + `,"node":"` + strings.Repeat("n", 254) + `"`,
		rank + `,"localWorldSize":null`, rank + `,"localWorldSize":0`, rank + `,"localWorldSize":3`,
		rank + `,"localWorldSize":true`, rank + `,"localWorldSize":2`, `,"localWorldSize":1`,
		`,"unknown":1`, rank + `,"rank":0`, `,"version":true`, rank + `,"step":true`,
	} {
		cases = append(cases, `{`+base+extra+`}`)
	}
	// A manifest listing no files (hand-made: no writer of ours makes one).
	cases = append(cases, `{"version":1,"step":3,"files":[],"savedAt":"2026-11-30T05:00:00Z"}`,
		`{"version":1,"step":3,"files":[],"savedAt":"2026-11-30T05:00:00Z"`+rank+`,"runId":"r-1"}`)
	for _, sa := range []string{"2026-11-30T05:00:00.123456Z", "2026-11-30T05:00:00+02:00", "2026-11-30", "2026-13-30T05:00:00Z",
		"2026-11-30t05:00:00z", "2026-11-30t05:00:00Z", "2026-11-30T05:00:00z", "2026-11-30T25:00:00Z", "", "2026-11-30T05:00:00", "x"} {
		cases = append(cases, strings.Replace(`{`+base+`}`, "2026-11-30T05:00:00Z", sa, 1))
	}
	for _, f := range []string{`{"path":"a","size":-1,"sha256":"` + sha + `"}`, `{"path":"../a","size":1,"sha256":"` + sha + `"}`,
		`{"path":"a","size":1,"sha256":"` + strings.ToUpper(sha) + `"}`, `{"path":"a","size":1.5,"sha256":"` + sha + `"}`,
		`{"path":"a","size":true,"sha256":"` + sha + `"}`} {
		cases = append(cases, `{"version":1,"step":3,"files":[`+f+`],"savedAt":"2026-11-30T05:00:00Z"}`)
	}
	// Raw bytes (review /tmp/rev-parity): keys encoding/json would fold or
	// keep the last of, invalid UTF-8, other encodings, trailing newlines
	// a Python "$" regex accepted.
	fileA := `"files":[{"path":"a","size":1,"sha256":"` + sha + `"}]`
	raw := [][]byte{
		[]byte(`{"version":1,"Step":3,"files":[],"savedAt":"2026-11-30T05:00:00Z"}`),
		[]byte(`{` + base + `,"STEP":4}`),
		[]byte(`{` + base + `,"step":3}`),
		[]byte(`{` + base + `,"Rank":1,"WorldSize":2}`),
		[]byte(`{"version":1,"\u017ftep":3,"files":[],"savedAt":"2026-11-30T05:00:00Z"}`),
		[]byte("{\"version\":1,\"\u017ftep\":3,\"files\":[],\"savedAt\":\"2026-11-30T05:00:00Z\"}"),
		append(append([]byte(`{`+base+rank+`,"tier":"local","node":"`), 0xff), []byte(`","localWorldSize":1}`)...),
		append([]byte{0xef, 0xbb, 0xbf}, []byte(`{`+base+`}`)...),
		{0xff, 0xfe, '{', 0, '}', 0},
		[]byte(`{"version":1,"step":3,"files":[{"Path":"a","size":1,"sha256":"` + sha + `"}],"savedAt":"2026-11-30T05:00:00Z"}`),
		[]byte(`{"version":1,"step":3,"files":[{"path":"a","path":"b","size":1,"sha256":"` + sha + `"}],"savedAt":"2026-11-30T05:00:00Z"}`),
		[]byte(`{` + base + rank + `,"runId":"abc\n"}`),
		[]byte(`{"version":1,"step":3,` + fileA + `,"savedAt":"2026-11-30T05:00:00Z\n"}`),
		[]byte(`{"version":1,"step":3,"files":[{"path":"a","size":1,"sha256":"` + sha + `\n"}],"savedAt":"2026-11-30T05:00:00Z"}`),
		[]byte(`{` + base + "}\n"),
	}
	for _, c := range cases {
		raw = append(raw, []byte(c))
	}
	in, _ := json.Marshal(raw) // base64 strings
	script := `
import sys, json, base64; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c
out = []
for raw in json.load(sys.stdin):
    try:
        c._parse_manifest(base64.b64decode(raw)); out.append(True)
    except (ValueError, TypeError, KeyError):
        out.append(False)
print(json.dumps(out))
`
	cmd := exec.Command(py, "-c", script, pythonDir(t))
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var pyOK []bool
	if err := json.Unmarshal(out, &pyOK); err != nil || len(pyOK) != len(raw) {
		t.Fatalf("python said %s (%v)", out, err)
	}
	for i, c := range raw {
		_, err := Parse(c)
		if (err == nil) != pyOK[i] {
			t.Errorf("Go accepts %v (%v), Python accepts %v: %q", err == nil, err, pyOK[i], c)
		}
		if i < 15 && (err == nil || pyOK[i]) && i != 14 {
			t.Errorf("raw case %d accepted (Go %v, Python %v), want both to refuse: %q", i, err == nil, pyOK[i], c)
		}
	}
}
