package main

import (
	"strings"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	// Under synctest: the demo's timings are exact on a loaded machine.
	synctest.Test(t, func(t *testing.T) {
		var out strings.Builder
		if err := run(&out); err != nil {
			t.Fatal(err)
		}
		want := `node-2: leader is node-1 (term 1)
node-2: insert order-1: tea is new
node-2: insert order-2: cake is new
node-2: update order-1: tea is paid
node-2: delete order-2
node-2: insert order-3: soup is new
view: order-1 = tea, paid
view: order-3 = soup, new
node-1 led throughout: true
`
		if out.String() != want {
			t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
		}
	})
}
