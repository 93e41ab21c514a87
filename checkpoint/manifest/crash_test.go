package manifest

// Crash tests: real writer processes (a Go one, this test binary
// re-executed, and the Python helper) are SIGKILLed at random moments while
// they save; both readers must then agree on a verified latest step.

import (
	"bufio"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupack/gpupack/test/testenv"
)

const envSaveLoop = "GPUPACK_TEST_SAVE_LOOP"

func TestMain(m *testing.M) {
	if dir := os.Getenv(envSaveLoop); dir != "" {
		os.Exit(saveLoop(dir))
	}
	os.Exit(m.Run())
}

// saveLoop is the Go writer: it saves steps after the newest one forever,
// printing "saved N" once each Save has returned.
func saveLoop(dir string) int {
	cp, ok, err := Latest(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	step := int64(1)
	if ok {
		step = cp.Manifest.Step + 1
	}
	fmt.Println("ready")
	for ; ; step++ {
		payload := make([]byte, 64<<10)
		rand.Read(payload)
		if _, err := Save(dir, step, map[string]WriteFunc{"model.bin": Bytes(payload), "optim/state.bin": Bytes(payload[:len(payload)/2])}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("saved %d\n", step)
	}
}

func pythonDir(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func python3(t *testing.T) string {
	t.Helper()
	return testenv.Command(t, "python3", "runs the Python manifest writer")
}

// pyLatest runs the Python reader.
func pyLatest(t *testing.T, dir string) int64 {
	t.Helper()
	out, err := exec.Command(python3(t), "-c",
		"import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c; s = c.latest(sys.argv[2]); print(-1 if s is None else s)",
		pythonDir(t), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("python latest(): %v\n%s", err, out)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatalf("python latest() printed %q", out)
	}
	return n
}

func TestKill9DuringSavesNeverLeavesATornLatest(t *testing.T) {
	py := python3(t)
	writers := map[string]func(dir string) *exec.Cmd{
		"go writer": func(dir string) *exec.Cmd {
			c := exec.Command(os.Args[0])
			c.Env = append(os.Environ(), envSaveLoop+"="+dir)
			return c
		},
		"python writer": func(dir string) *exec.Cmd {
			return exec.Command(py, filepath.Join(pythonDir(t), "testdata", "trainer.py"),
				"--mode", "saveloop", "--dir", dir, "--saves", "1000000", "--size", strconv.Itoa(64<<10))
		},
	}
	const wantSaves, wantKills = 100, 25
	for name, writer := range writers {
		t.Run(name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := mrand.New(mrand.NewPCG(seed, 7))
			dir := t.TempDir()
			saves, kills, midSave := 0, 0, 0
			reported := int64(-1) // newest step a writer said it saved
			for saves < wantSaves || kills < wantKills {
				printed, last := runAndKill(t, writer(dir), time.Duration(rng.IntN(300_000))*time.Microsecond)
				saves += printed
				if printed > 0 {
					reported = last
				}
				kills++
				checkConsistent(t, dir, reported)
				if removeTemps(t, dir) {
					midSave++ // the kill landed inside a save
				}
				if t.Failed() {
					t.Fatalf("after %d kills, %d saves", kills, saves)
				}
			}
			t.Logf("%d saves, %d kills, %d of them inside a save", saves, kills, midSave)
			if midSave == 0 {
				t.Errorf("no kill landed inside a save; the test proved nothing")
			}
		})
	}
}

// runAndKill starts a writer, lets it run for d after it is ready, SIGKILLs
// it, and returns how many saves it reported and the last reported step.
func runAndKill(t *testing.T, cmd *exec.Cmd, d time.Duration) (printed int, last int64) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if line == "ready" {
				close(ready)
				continue
			}
			if s, ok := strings.CutPrefix(line, "saved "); ok {
				n, _ := strconv.ParseInt(s, 10, 64)
				mu.Lock()
				printed++
				last = n
				mu.Unlock()
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("writer not ready: %s", stderr.String())
	}
	time.Sleep(d)
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		t.Fatalf("writer ended by itself (%v): %s", err, stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	return printed, last
}

// removeTemps deletes what interrupted saves left (as Prune would) and
// says whether there was any.
func removeTemps(t *testing.T, dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), TempPrefix) {
			found = true
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	return found
}

// checkConsistent: every step directory verifies (saves are atomic, so a
// torn one must never appear under its final name), the Go and Python
// readers name the same newest step, and every save the writer reported
// as done survived.
func checkConsistent(t *testing.T, dir string, lastReported int64) {
	t.Helper()
	steps, err := Steps(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if _, err := Verify(filepath.Join(dir, StepDirName(s))); err != nil {
			t.Errorf("torn step directory under its final name: %v", err)
		}
	}
	goLatest := int64(-1)
	if cp, ok, err := Latest(dir); err != nil {
		t.Fatal(err)
	} else if ok {
		goLatest = cp.Manifest.Step
	}
	if diff := cmp.Diff(goLatest, pyLatest(t, dir)); diff != "" {
		t.Errorf("Go and Python latest differ (-go +python):\n%s", diff)
	}
	if len(steps) > 0 && goLatest != steps[0] {
		t.Errorf("Latest = %d but the newest step directory is %d", goLatest, steps[0])
	}
	if goLatest < lastReported {
		t.Errorf("Latest = %d, but the writer reported step %d saved", goLatest, lastReported)
	}
}

func TestPythonHelperUnitTests(t *testing.T) {
	out, err := exec.Command(python3(t), "-m", "unittest", "discover", "-s", pythonDir(t), "-p", "test_*.py").CombinedOutput()
	if err != nil {
		t.Fatalf("python unit tests failed: %v\n%s", err, out)
	}
}

// Both implementations read what the other wrote, nested paths included.
func TestCrossLanguageFormat(t *testing.T) {
	py := python3(t)
	dir := t.TempDir()
	if _, err := Save(dir, 41, map[string]WriteFunc{"a/b/c.bin": Bytes([]byte("go")), "top": Bytes(nil)}); err != nil {
		t.Fatal(err)
	}
	if got := pyLatest(t, dir); got != 41 {
		t.Errorf("python latest() of a Go checkpoint = %d, want 41", got)
	}
	out, err := exec.Command(py, "-c",
		"import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c; c.save(sys.argv[2], 42, {'x/y.bin': b'py', 'empty': b''})",
		pythonDir(t), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("python save: %v\n%s", err, out)
	}
	cp, err := Verify(filepath.Join(dir, StepDirName(42)))
	if err != nil {
		t.Fatalf("Go cannot verify a Python checkpoint: %v", err)
	}
	want := []File{
		{Path: "empty", Size: 0, SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{Path: "x/y.bin", Size: 2, SHA256: cp.Manifest.Files[1].SHA256},
	}
	if diff := cmp.Diff(want, cp.Manifest.Files); diff != "" {
		t.Errorf("files of the Python checkpoint (-want +got):\n%s", diff)
	}
}
