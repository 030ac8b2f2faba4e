package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql" // the driver, registered as "mysql"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/mysqlstore"
)

// Example_open locks a key in a table of a MySQL or MariaDB database named
// by a URL. (Not run: it needs a server.)
func Example_open() {
	ctx := context.Background()
	store, err := mysqlstore.Open(ctx, "mysql://app:secret@db.internal:3306/shop?table=reqlock_locks")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	locker, err := reqlock.New(store)
	if err != nil {
		log.Fatal(err)
	}
	lock, err := locker.Obtain(ctx, "sku:42", 10*time.Second, 2*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)
	// Write with the fence: UPDATE stock SET n = n - 1, fence = ? WHERE
	// sku = 42 AND fence < ?, so that a holder whose lease ran out cannot
	// overwrite its successor's work.
	fmt.Println("fence", lock.Fence())
}

// ExampleNew keeps the leases in a table of an application's own *sql.DB,
// created by the operator from schema.sql.
func ExampleNew() {
	db, err := sql.Open("mysql", "app:secret@tcp(db.internal:3306)/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxIdleConns(64) // database/sql keeps 2 by default
	store, err := mysqlstore.New(db, mysqlstore.WithTable("locks"), mysqlstore.WithoutCreateTable())
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	locker := reqlock.MustNew(store)
	_ = locker
}
