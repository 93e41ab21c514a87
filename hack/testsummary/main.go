// Command testsummary reads `go test -json` and prints per-package results,
// the output of failed tests, and one closing line "N passed, N failed, N skipped".
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// testLine is a line a test itself wrote (t.Log, t.Error, t.Fatal: file
// and line of a _test.go), as opposed to the component logs it relays.
var testLine = regexp.MustCompile(`^\s+[\w.-]+_test\.go:\d+: `)

// recap is what a reader needs first when only the end of the output is
// shown (CI shows its tail): per failed test, the lines the test wrote
// itself, the last maxRecap of them, each cut to 300 characters.
func recap(name, out string) string {
	const maxRecap = 30
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if testLine.MatchString(l) || strings.HasPrefix(l, "panic: ") || strings.Contains(l, "test timed out") {
			if len(l) > 300 {
				l = l[:300] + "…"
			}
			lines = append(lines, l)
		}
	}
	if len(lines) > maxRecap {
		lines = lines[len(lines)-maxRecap:]
	}
	return fmt.Sprintf("--- %s\n%s\n", name, strings.Join(lines, "\n"))
}

// skipReason is the last line the skipped test wrote itself (t.Skip's
// message), or "" when it wrote none.
func skipReason(b *strings.Builder) string {
	if b == nil {
		return ""
	}
	reason := ""
	for _, l := range strings.Split(b.String(), "\n") {
		if testLine.MatchString(l) {
			reason = strings.TrimSpace(l)
		}
	}
	if len(reason) > 300 {
		reason = reason[:300] + "…"
	}
	return reason
}

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func main() {
	outputs := map[string]*strings.Builder{} // package/test → output
	var passed, failed, skipped int
	var failedTests, skippedTests []string
	pkgResults := map[string]string{}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Println(sc.Text()) // build errors come as plain text
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			b := outputs[key]
			if b == nil {
				b = &strings.Builder{}
				outputs[key] = b
			}
			if b.Len() < 1<<20 {
				b.WriteString(e.Output)
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				pkgResults[e.Package] = fmt.Sprintf("%-4s %s %.1fs", map[string]string{"pass": "ok", "fail": "FAIL", "skip": "skip"}[e.Action], e.Package, e.Elapsed)
				if e.Action == "fail" {
					failedTests = append(failedTests, key)
				}
				continue
			}
			if strings.Contains(e.Test, "/") { // subtests are counted through their parents
				if e.Action == "fail" {
					failedTests = append(failedTests, key)
				}
				continue
			}
			switch e.Action {
			case "pass":
				passed++
			case "fail":
				failed++
				failedTests = append(failedTests, key)
			case "skip":
				skipped++
				skippedTests = append(skippedTests, key)
			}
		}
	}
	pkgs := make([]string, 0, len(pkgResults))
	for p := range pkgResults {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		fmt.Println(pkgResults[p])
	}
	for _, k := range failedTests {
		if b := outputs[k]; b != nil {
			fmt.Printf("\n=== output of %s ===\n%s", k, b.String())
		}
	}
	if len(failedTests) > 0 {
		fmt.Printf("\n=== failures in short (the lines each failed test wrote itself; its full output is above) ===\n")
		for _, k := range failedTests {
			if b := outputs[k]; b != nil && !strings.HasSuffix(k, " ") {
				fmt.Print(recap(k, b.String()))
			}
		}
	}
	if len(skippedTests) > 0 {
		sort.Strings(skippedTests)
		fmt.Printf("\n=== skipped (each with its reason) ===\n")
		for _, k := range skippedTests {
			fmt.Printf("%s: %s\n", k, skipReason(outputs[k]))
		}
	}
	fmt.Printf("\n%d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if failed > 0 {
		os.Exit(1)
	}
	for _, r := range pkgResults {
		if strings.HasPrefix(r, "FAIL") {
			os.Exit(1)
		}
	}
}
