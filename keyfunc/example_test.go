package keyfunc_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/reqlock/reqlock/keyfunc"
)

// A route declares its template once; each request renders its own key.
func Example() {
	tmpl := keyfunc.MustParse("sku:<id>:<query:warehouse>")

	mux := http.NewServeMux()
	mux.HandleFunc("POST /skus/{id}", func(w http.ResponseWriter, r *http.Request) {
		key, err := tmpl.Key(keyfunc.HTTPRequest(r))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Println(key)
	})

	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/skus/A-1?warehouse=eu+west", nil))
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/skus/A:1?warehouse=eu", nil))
	// Output:
	// sku:A%2D1:eu%20west
	// sku:A%3A1:eu
}

func ExampleParse() {
	_, err := keyfunc.Parse("sku:<id")
	fmt.Println(err)
	fmt.Println(errors.Is(err, keyfunc.ErrSyntax))
	// Output:
	// keyfunc: invalid template: "sku:<id": unclosed placeholder at offset 4
	// true
}

func ExampleTemplate_Key() {
	tmpl, err := keyfunc.Parse("order:<header:X-Tenant>:<json:order.sku>")
	if err != nil {
		panic(err) // start-up
	}
	r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"order":{"sku":"A1","qty":2}}`))
	r.Header.Set("X-Tenant", "acme")

	key, err := tmpl.Key(keyfunc.HTTPRequest(r))
	fmt.Println(key, err)

	body, _ := io.ReadAll(r.Body) // the handler still reads the whole body
	fmt.Println(string(body))

	_, err = tmpl.Key(keyfunc.HTTPRequest(httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))))
	fmt.Println(err)
	fmt.Println(errors.Is(err, keyfunc.ErrMissing))
	// Output:
	// order:acme:A1 <nil>
	// {"order":{"sku":"A1","qty":2}}
	// keyfunc: key value missing: <header:X-Tenant>
	// true
}

// A template with [*] locks every SKU of a cart.
func ExampleTemplate_Keys() {
	tmpl := keyfunc.MustParse("sku:<json:items[*].sku>")
	fmt.Println(tmpl.Multi())

	body := `{"items":[{"sku":"A-1","qty":1},{"sku":"B","qty":2}]}`
	keys, err := tmpl.Keys(keyfunc.HTTPRequest(httptest.NewRequest("POST", "/carts/7/checkout", strings.NewReader(body))))
	fmt.Println(keys, err)

	_, err = tmpl.Keys(keyfunc.HTTPRequest(httptest.NewRequest("POST", "/carts/7/checkout", strings.NewReader(`{"items":[{"sku":"A"},{"qty":2}]}`))))
	fmt.Println(err)
	// Output:
	// true
	// [sku:A%2D1 sku:B] <nil>
	// keyfunc: key value missing: <json:items[*].sku>: at items[1]
}
