package devicehook

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The environment parser runs in a long-lived C process (the ASan/UBSan
// build), fed one environ block per fuzz input, and is checked against an
// independent Go reading of the contract in docs/devicehook.md.

type parser struct {
	in  io.Writer
	out *bufio.Reader
}

var (
	parserOnce sync.Once
	theParser  *parser
	parserErr  error
)

func envParser() (*parser, error) {
	parserOnce.Do(func() {
		cmd := exec.Command(filepath.Join(buildDir, "envparse-asan"))
		cmd.Env = append(env{}.list(), "ASAN_OPTIONS=detect_leaks=0:halt_on_error=1", "UBSAN_OPTIONS=halt_on_error=1")
		in, err := cmd.StdinPipe()
		if err != nil {
			parserErr = err
			return
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			parserErr = err
			return
		}
		parserErr = cmd.Start()
		theParser = &parser{in: in, out: bufio.NewReader(out)}
	})
	return theParser, parserErr
}

// parse returns the C parser's result line and how many ERROR lines it logged.
func (p *parser) parse(environ []string) (string, int, error) {
	block := strings.Join(environ, "\x00")
	var hdr [4]byte
	binary.LittleEndian.PutUint32(hdr[:], uint32(len(block)))
	if _, err := p.in.Write(append(hdr[:], block...)); err != nil {
		return "", 0, err
	}
	errs := 0
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			return "", 0, fmt.Errorf("parser died (sanitizer report?): %v: %q", err, line)
		}
		if strings.HasPrefix(line, "mem=") {
			return strings.TrimSpace(line), errs, nil
		}
		if strings.Contains(line, " ERROR] ") {
			errs++
		}
	}
}

// refSize: digits, then at most one of k/m/g/t (binary, any case); no overflow.
func refSize(s string) (uint64, bool) {
	shift := uint(0)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			shift = 10
		case 'm', 'M':
			shift = 20
		case 'g', 'G':
			shift = 30
		case 't', 'T':
			shift = 40
		}
		if shift > 0 {
			s = s[:n-1]
		}
	}
	if s == "" || strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > (^uint64(0))>>shift {
		return 0, false
	}
	return v << shift, true
}

func refPercent(s string) (int, bool) {
	if s == "" || strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return 0, false
	}
	v, ok := refSize(s)
	if !ok || v > 100 {
		return 0, false
	}
	return int(v), true
}

func refBool(s string) (bool, bool) {
	switch strings.ToLower(s) {
	case "1", "true", "yes", "on":
		return true, true
	case "0", "false", "no", "off", "":
		return false, true
	}
	return false, false
}

const none = ^uint64(0)

// refConfig is the contract: what the hook must conclude from vars, and
// whether it must complain.
func refConfig(vars map[string]string) (string, bool) {
	bad := false
	get := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	logLevel := 1
	if v, ok := get("LIBCUDA_LOG_LEVEL"); ok {
		if l, ok := refPercent(v); ok && l <= 4 {
			logLevel = l
		} else {
			bad = true
		}
	}
	disabled := false
	if v, ok := get("CUDA_DISABLE_CONTROL"); ok {
		if d, ok := refBool(v); ok {
			disabled = d
		} else {
			bad = true
		}
	}
	generic, genericBad := none, false
	if v, ok := get("CUDA_DEVICE_MEMORY_LIMIT"); ok {
		if b, ok := refSize(v); ok {
			if b != 0 {
				generic = b
			}
		} else {
			genericBad, bad = true, true
		}
	}
	mem := make([]uint64, 2)
	for i := range mem {
		mem[i] = generic
		if genericBad {
			mem[i] = 0
		}
		if v, ok := get(fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)); ok {
			if b, ok := refSize(v); ok {
				mem[i] = b
				if b == 0 {
					mem[i] = none
				}
			} else {
				bad = true
				mem[i] = generic
				if genericBad || generic == none {
					mem[i] = 0 // refuse rather than guess "unlimited"
				}
			}
		}
	}
	smGeneric := 0
	if v, ok := get("CUDA_DEVICE_SM_LIMIT"); ok {
		if p, ok := refPercent(v); ok {
			smGeneric = p
		} else {
			bad = true
		}
	}
	sm := []int{smGeneric, smGeneric}
	for i := range sm {
		if v, ok := get(fmt.Sprintf("CUDA_DEVICE_SM_LIMIT_%d", i)); ok {
			if p, ok := refPercent(v); ok {
				sm[i] = p
			} else {
				bad = true
			}
		}
		if sm[i] >= 100 {
			sm[i] = 0
		}
	}
	period := uint64(100)
	if v, ok := get("GPUPACK_SM_PERIOD_MS"); ok {
		if p, ok := refSize(v); ok && p >= 1 && p <= 10000 {
			period = p
		} else {
			bad = true
		}
	}
	reserve := uint64(0)
	if v, ok := get("GPUPACK_CONTEXT_RESERVE"); ok {
		if r, ok := refSize(v); ok {
			reserve = r
		} else {
			bad = true
		}
	}
	lim := func(b uint64) string {
		if b == none {
			return "none"
		}
		return strconv.FormatUint(b, 10)
	}
	dis := 0
	if disabled {
		dis = 1
	}
	return fmt.Sprintf("mem=%s,%s sm=%d,%d reserve=%d period=%d log=%d disabled=%d",
		lim(mem[0]), lim(mem[1]), sm[0], sm[1], reserve, period, logLevel, dis), bad
}

var fuzzKeys = []string{"CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_MEMORY_LIMIT_1",
	"CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_SM_LIMIT_1", "GPUPACK_CONTEXT_RESERVE", "GPUPACK_SM_PERIOD_MS",
	"LIBCUDA_LOG_LEVEL", "CUDA_DISABLE_CONTROL"}

func checkEnv(t *testing.T, present uint16, values []string) {
	t.Helper()
	p, err := envParser()
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	var environ []string
	for i, k := range fuzzKeys {
		if present&(1<<i) == 0 {
			continue
		}
		v := strings.ReplaceAll(values[i], "\x00", "") // a NUL cannot be in an environment
		vars[k] = v
		environ = append(environ, k+"="+v)
	}
	got, errs, err := p.parse(environ)
	if err != nil {
		t.Fatal(err)
	}
	want, bad := refConfig(vars)
	if got != want {
		t.Errorf("environment %q:\n got  %s\n want %s", environ, got, want)
	}
	if bad != (errs > 0) {
		t.Errorf("environment %q: %d ERROR lines, want complaints=%v (malformed values must be loud, valid ones quiet)",
			environ, errs, bad)
	}
}

func TestEnvParseContract(t *testing.T) {
	all := uint16(1<<len(fuzzKeys) - 1)
	cases := []struct {
		name    string
		present uint16
		values  []string
	}{
		{"unset", 0, make([]string, 9)},
		{"suffixes", all, []string{"4g", "512M", "0", "30", "100", "256k", "20", "4", "false"}},
		{"bytes and per-device override", 0b11, []string{"1073741824", "2048m", "", "", "", "", "", "", ""}},
		{"malformed generic refuses all", 0b1, []string{"4 GiB", "", "", "", "", "", "", "", ""}},
		{"malformed per-device falls back to generic", 0b11, []string{"8g", "lots", "", "", "", "", "", "", ""}},
		{"malformed per-device without generic refuses", 0b10, []string{"", "-1", "", "", "", "", "", "", ""}},
		{"overflow", 0b101, []string{"18446744073709551615k", "", "99999999999999999999", "", "", "", "", "", ""}},
		{"sm over 100 and junk", 0b11000, []string{"", "", "", "101", "3O", "", "", "", ""}},
		{"bad knobs", 0b111100000, []string{"", "", "", "", "", "1.5g", "0", "9", "maybe"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkEnv(t, c.present, c.values) })
	}
}

func FuzzEnvParse(f *testing.F) {
	f.Add(uint16(0x1ff), "4g", "512M", "0", "30", "100", "256k", "20", "4", "true")
	f.Add(uint16(0x3), "1073741824", "x", "", "", "", "", "", "", "")
	f.Add(uint16(0x18), "", "", "", "0100", "101", "", "", "", "")
	f.Add(uint16(0x1e0), "", "", "", "", "", "18446744073709551615", "10001", "-1", "Yes")
	f.Fuzz(func(t *testing.T, present uint16, a, b, c, d, e, g, h, i, j string) {
		checkEnv(t, present, []string{a, b, c, d, e, g, h, i, j})
	})
}
