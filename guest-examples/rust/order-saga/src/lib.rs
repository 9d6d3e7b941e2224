//! `order-saga`: reserve inventory → charge the card → ship, each a durable step. When a
//! step fails for good, the steps already done are compensated in reverse order (ship
//! failed: refund, then release the stock), each compensation a durable step too, and
//! the run fails with the reason.
//!
//! Input `{"order_id": "A1", "sku": "book", "quantity": 2, "amount_cents": 4200}`; set
//! `"fail_at": "charge" | "ship"` to simulate a permanent failure there. Output
//! `{"order_id": "A1", "status": "shipped", "reservation": ..., "payment": ..., "tracking": ...}`.
//!
//! A transient failure (returned as `Error::retryable`) is retried by wasq instead, and
//! the retry resumes at the failed step: the stock is not reserved twice.

use serde::{Deserialize, Serialize};
use wasq_guest::{Error, info, progress, step, warn};

#[derive(Deserialize)]
struct Order {
    order_id: String,
    sku: String,
    quantity: u32,
    amount_cents: u64,
    #[serde(default)]
    fail_at: Option<String>,
}

#[derive(Serialize)]
struct Shipped {
    order_id: String,
    status: &'static str,
    reservation: String,
    payment: String,
    tracking: String,
}

/// Work the saga has done and must undo if a later step fails, newest last.
enum Done {
    Reserved(String),
    Charged(String),
}

fn simulate(order: &Order, at: &str) -> Result<(), Error> {
    if order.fail_at.as_deref() == Some(at) {
        return Err(Error::fatal(format!("{at} failed for order {}", order.order_id)));
    }
    Ok(())
}

fn compensate(done: Vec<Done>, order: &Order) -> Result<(), Error> {
    for work in done.into_iter().rev() {
        match work {
            Done::Charged(payment) => step::run("refund-payment", || {
                warn!("refunding {} cents of {payment}", order.amount_cents);
                Ok(format!("refund-of-{payment}"))
            })?,
            Done::Reserved(reservation) => step::run("release-inventory", || {
                warn!("releasing {} x {} ({reservation})", order.quantity, order.sku);
                Ok(format!("released-{reservation}"))
            })?,
        };
    }
    Ok(())
}

fn saga(order: Order) -> Result<Shipped, Error> {
    let mut done = Vec::new();
    let reservation: String = step::run("reserve-inventory", || {
        info!("reserving {} x {} for {}", order.quantity, order.sku, order.order_id);
        Ok(format!("rsv-{}", order.order_id))
    })?;
    done.push(Done::Reserved(reservation.clone()));
    progress::report(33, Some("inventory reserved"));

    let payment = step::run("charge-payment", || {
        simulate(&order, "charge")?;
        info!("charging {} cents for {}", order.amount_cents, order.order_id);
        Ok(format!("pay-{}", order.order_id))
    });
    let payment: String = match payment {
        Ok(p) => p,
        Err(e) => return Err(undo(e, done, &order)),
    };
    done.push(Done::Charged(payment.clone()));
    progress::report(66, Some("payment charged"));

    let tracking = step::run("ship-order", || {
        simulate(&order, "ship")?;
        info!("shipping {}", order.order_id);
        Ok(format!("trk-{}", order.order_id))
    });
    let tracking: String = match tracking {
        Ok(t) => t,
        Err(e) => return Err(undo(e, done, &order)),
    };
    progress::report(100, Some("shipped"));
    Ok(Shipped { order_id: order.order_id, status: "shipped", reservation, payment, tracking })
}

/// A permanent failure undoes the saga; a transient one is left to wasq's retries.
fn undo(error: Error, done: Vec<Done>, order: &Order) -> Error {
    if error.kind() != wasq_guest::ErrorKind::Fatal {
        return error;
    }
    match compensate(done, order) {
        Ok(()) => Error::fatal(format!("{}; compensated", error.message())),
        Err(e) => e,
    }
}

wasq_guest::task!(saga);
