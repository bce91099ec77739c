//! `outbox backfill`'s walk back: the position right after each execution
//! of one position that has no announcement (an earlier version executed
//! it), from the position now and what the store recorded. Pure; both
//! stores read the rows, call [`walk_back`], and write what it answers.
//!
//! What orders one position's executions:
//! - `ExecutedAt`, to the millisecond ([`Executed::tie`]);
//! - within one millisecond, for executions with an outbox row, the row's
//!   `Seq`: it is allocated by the insert made with the position locked, so
//!   it follows the order the executions took the lock in. `Orders.Id`
//!   does not: on SQL Server it is taken when the order's row is inserted,
//!   before the lock;
//! - each announced execution's row also records its exact position after
//!   it. The walk resets to it, and it places the unannounced executions of
//!   its millisecond: only the true order's walk agrees with every record.
//!
//! Nothing recorded under the lock orders two unannounced executions of
//! one millisecond relative to each other, so where the records cannot
//! tell, they are taken in `Orders.Id` order.

use rust_decimal::Decimal;

use crate::order::Side;
use crate::position::Position;

/// One execution of the position since the backfill's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executed {
    /// Its `ExecutedAt` millisecond as a rank (`DENSE_RANK() OVER (ORDER BY
    /// ExecutedAt)`): equal for executions in one millisecond, greater for
    /// later ones.
    pub tie: i64,
    /// `Orders.Id`.
    pub id: i64,
    pub side: Side,
    pub quantity: Decimal,
    /// Its outbox row's `Seq` and the position after it that row records;
    /// `None`: unannounced.
    pub announced: Option<(i64, Position)>,
}

/// Most executions in one millisecond whose orders are searched for the
/// one the records agree with: the search tries up to `(a + 1)^u` orders
/// (`a` announced, `u` unannounced), 1024 at most for 8.
pub const MAX_SEARCHED: usize = 8;

/// The position after each unannounced execution of one position, oldest
/// first (the order the backfill writes them in, so their new `Seq`s follow
/// execution order), as `(index in executions, position after)`; walking
/// back from `now` through `executions` (one position's, since the
/// backfill's start, in any order), latest first:
///
/// - executions in [`Executed::tie`] order; within one millisecond,
///   announced ones in `Seq` order;
/// - at an announced execution the walk takes the position its row
///   records (exact), whatever the walk reached;
/// - the unannounced executions of a millisecond with announced ones go
///   where the walk agrees with every announced row's record: each
///   unannounced execution, in `Orders.Id` order, is put as early among the
///   announced ones as an agreeing order allows. Where several orders
///   agree (the records cannot tell them apart) and in a millisecond with
///   no announced execution, unannounced executions keep `Orders.Id` order:
///   nothing recorded under the lock orders them.
///
/// `None` if a step leaves `DECIMAL(38,10)` (a position that no sequence of
/// executions reached).
pub fn walk_back(now: Position, executions: &[Executed]) -> Option<Vec<(usize, Position)>> {
    let mut by_tie: Vec<usize> = (0..executions.len()).collect();
    by_tie.sort_by_key(|&i| (executions[i].tie, executions[i].id));
    let mut current = now;
    let mut latest_first = Vec::new();
    for group in by_tie
        .chunk_by(|&a, &b| executions[a].tie == executions[b].tie)
        .rev()
    {
        let order = order_of(current, executions, group);
        for &i in order.iter().rev() {
            let e = &executions[i];
            match e.announced {
                Some((_, recorded)) => current = recorded,
                None => latest_first.push((i, current)),
            }
            current = before(current, e)?;
        }
    }
    latest_first.reverse();
    Some(latest_first)
}

/// The position before `e`, from the one after it.
fn before(after: Position, e: &Executed) -> Option<Position> {
    let change = Position::change_of(e.side, e.quantity);
    after
        .units()
        .checked_sub(change.units())
        .and_then(Position::from_units)
}

/// The order (oldest first) of one millisecond's executions (`group`,
/// indices into `executions`), the position after them being `after`.
fn order_of(after: Position, executions: &[Executed], group: &[usize]) -> Vec<usize> {
    let mut announced: Vec<usize> = group
        .iter()
        .copied()
        .filter(|&i| executions[i].announced.is_some())
        .collect();
    announced.sort_by_key(|&i| {
        (
            executions[i].announced.map(|(seq, _)| seq),
            executions[i].id,
        )
    });
    let mut unannounced: Vec<usize> = group
        .iter()
        .copied()
        .filter(|&i| executions[i].announced.is_none())
        .collect();
    unannounced.sort_by_key(|&i| executions[i].id);
    if group.len() <= MAX_SEARCHED {
        // Each unannounced execution's slot: before the announced one of
        // that index, or after them all (`announced.len()`); slot vectors
        // tried in ascending order, the lowest `Orders.Id` most significant,
        // so the first that agrees puts each as early as the records allow.
        // With no announced execution the one vector puts them all in
        // `Orders.Id` order; with no unannounced one it is the empty one.
        let orders = (announced.len() + 1).pow(unannounced.len() as u32);
        let mut slots = vec![0; unannounced.len()];
        for _ in 0..orders {
            let order = interleave(&announced, &unannounced, &slots);
            if agrees(after, executions, &order) {
                return order;
            }
            next_slots(&mut slots, announced.len());
        }
    }
    // Beyond the search's bound, or where no order agrees with the records
    // (they contradict the walk: the position now is not the executions'
    // sum), nothing better is known than the order the rows were inserted
    // in (`Orders.Id`), announced ones kept in `Seq` order: the two sorted
    // lists merged by `Orders.Id`. The walk still resets at each record.
    let mut merged = Vec::with_capacity(group.len());
    let mut rest = unannounced.into_iter().peekable();
    for i in announced {
        while let Some(u) = rest.next_if(|&u| executions[u].id < executions[i].id) {
            merged.push(u);
        }
        merged.push(i);
    }
    merged.extend(rest);
    merged
}

/// `announced` in order, each unannounced execution (in order) before the
/// announced one its slot names, or after them all.
fn interleave(announced: &[usize], unannounced: &[usize], slots: &[usize]) -> Vec<usize> {
    let mut order = Vec::with_capacity(announced.len() + unannounced.len());
    for slot in 0..=announced.len() {
        order.extend(
            unannounced
                .iter()
                .zip(slots)
                .filter(|&(_, &s)| s == slot)
                .map(|(&i, _)| i),
        );
        if let Some(&i) = announced.get(slot) {
            order.push(i);
        }
    }
    order
}

/// The next slot vector in ascending order (the last digit counting
/// fastest, each from 0 to `most`; after the last, the first again).
fn next_slots(slots: &mut [usize], most: usize) {
    for digit in slots.iter_mut().rev() {
        if *digit < most {
            *digit += 1;
            return;
        }
        *digit = 0;
    }
}

/// Whether walking back from `after` through `order` (oldest first) meets
/// every announced execution at the position its row records.
fn agrees(after: Position, executions: &[Executed], order: &[usize]) -> bool {
    let mut current = after;
    for &i in order.iter().rev() {
        let e = &executions[i];
        if e.announced.is_some_and(|(_, recorded)| recorded != current) {
            return false;
        }
        match before(current, e) {
            Some(p) => current = p,
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Position {
        s.parse().unwrap()
    }

    /// An unannounced execution at millisecond `tie` with `Orders.Id` `id`.
    fn unannounced(tie: i64, id: i64, side: Side, quantity: &str) -> Executed {
        Executed {
            tie,
            id,
            side,
            quantity: quantity.parse().unwrap(),
            announced: None,
        }
    }

    /// An announced one: its row's `Seq` and recorded position after.
    fn announced(tie: i64, id: i64, side: Side, quantity: &str, seq: i64, after: &str) -> Executed {
        Executed {
            announced: Some((seq, p(after))),
            ..unannounced(tie, id, side, quantity)
        }
    }

    /// `walk_back`'s answer as (`Orders.Id`, position after) pairs.
    fn walked(now: &str, executions: &[Executed]) -> Option<Vec<(i64, Position)>> {
        walk_back(p(now), executions).map(|placed| {
            placed
                .into_iter()
                .map(|(i, after)| (executions[i].id, after))
                .collect()
        })
    }

    use Side::{Buy, Sell};

    #[test]
    fn the_walk_goes_back_from_now_through_each_execution_and_answers_oldest_first() {
        // Executed: buy 5, sell 1.5, buy 0.0000000001; now 3.5000000001.
        let executions = [
            unannounced(3, 30, Buy, "0.0000000001"),
            unannounced(1, 10, Buy, "5"),
            unannounced(2, 20, Sell, "1.5"),
        ];
        assert_eq!(
            walk_back(p("3.5000000001"), &executions),
            Some(vec![(1, p("5")), (2, p("3.5")), (0, p("3.5000000001"))])
        );
    }

    #[test]
    fn no_executions_answer_nothing() {
        assert_eq!(walked("7", &[]), Some(vec![]));
    }

    #[test]
    fn a_step_that_leaves_decimal_38_10_answers_none() {
        let top = Position::from_units(10_i128.pow(38) - 1).unwrap();
        let executions = [unannounced(1, 1, Sell, "1"), unannounced(2, 2, Sell, "1")];
        assert_eq!(walk_back(top, &executions), None);
        // The step before the oldest execution counts too.
        assert_eq!(walk_back(top, &executions[..1]), None);
        // Reset to a record at the top, a sell before it leaves the range.
        let mut reset = [unannounced(1, 1, Sell, "1"), unannounced(2, 2, Buy, "1")];
        reset[0].announced = Some((5, top));
        assert_eq!(walk_back(top, &reset), None, "from a record");
    }

    #[test]
    fn the_millisecond_orders_executions_before_orders_id() {
        // The later millisecond holds the lower `Orders.Id`.
        let executions = [unannounced(2, 1, Buy, "1"), unannounced(1, 2, Buy, "2")];
        assert_eq!(
            walked("3", &executions),
            Some(vec![(2, p("2")), (1, p("3"))])
        );
    }

    #[test]
    fn unannounced_executions_of_one_millisecond_keep_orders_id_order() {
        let executions = [
            unannounced(1, 3, Sell, "1"),
            unannounced(1, 1, Buy, "10"),
            unannounced(1, 2, Buy, "2"),
        ];
        assert_eq!(
            walked("11", &executions),
            Some(vec![(1, p("10")), (2, p("12")), (3, p("11"))])
        );
    }

    #[test]
    fn a_record_places_an_unannounced_execution_after_it_despite_a_lower_orders_id() {
        // Buy 10 (earlier millisecond), then in one millisecond: sell 1.5
        // (announced, Id 3, recorded 8.5), buy 5 (Id 2: its row inserted
        // first, its execution second); then buy 2. Now 15.5.
        let executions = [
            unannounced(1, 1, Buy, "10"),
            unannounced(2, 2, Buy, "5"),
            announced(2, 3, Sell, "1.5", 40, "8.5"),
            unannounced(3, 4, Buy, "2"),
        ];
        assert_eq!(
            walked("15.5", &executions),
            Some(vec![(1, p("10")), (2, p("13.5")), (4, p("15.5"))])
        );
    }

    #[test]
    fn a_record_places_an_unannounced_execution_before_it_despite_a_higher_orders_id() {
        // Buy 5 (Id 9) executed before sell 1.5 (Id 3, recorded 3.5).
        let executions = [
            announced(1, 3, Sell, "1.5", 40, "3.5"),
            unannounced(1, 9, Buy, "5"),
        ];
        assert_eq!(walked("3.5", &executions), Some(vec![(9, p("5"))]));
    }

    #[test]
    fn several_records_place_unannounced_executions_between_them_in_seq_order() {
        // One millisecond: buy 1 (Id 5), A buy 10 (Id 4, Seq 2, 11),
        // buy 100 (Id 1), B sell 3 (Id 2, Seq 3, 108), buy 1000 (Id 3).
        // Seq, not `Orders.Id`, orders A and B.
        let executions = [
            unannounced(1, 1, Buy, "100"),
            announced(1, 2, Sell, "3", 3, "108"),
            unannounced(1, 3, Buy, "1000"),
            announced(1, 4, Buy, "10", 2, "11"),
            unannounced(1, 5, Buy, "1"),
        ];
        assert_eq!(
            walked("1108", &executions),
            Some(vec![(5, p("1")), (1, p("111")), (3, p("1108"))])
        );
    }

    #[test]
    fn the_walk_resets_to_each_record() {
        // The record says 50 after the announced buy 1, whatever the walk
        // from now reached (41): the executions before it walk from 50.
        let executions = [
            unannounced(1, 1, Buy, "7"),
            announced(2, 2, Buy, "1", 10, "50"),
            unannounced(3, 3, Sell, "9"),
        ];
        assert_eq!(
            walked("40", &executions),
            Some(vec![(1, p("49")), (3, p("40"))])
        );
    }

    #[test]
    fn an_order_whose_walk_leaves_decimal_38_10_is_not_the_one_taken() {
        // Now and the record: the top less 1; a sell of 1 (announced), a
        // buy of 1 and a sell of 1 in one millisecond. Both unannounced
        // before the record agree with it, but the walk through them goes
        // past the top: they came after it.
        let one = Position::from(1).units();
        let top = Position::from_units(10_i128.pow(38) - 1).unwrap();
        let below = Position::from_units(top.units() - one).unwrap();
        let mut executions = [
            unannounced(1, 1, Sell, "1"),
            unannounced(1, 2, Buy, "1"),
            unannounced(1, 3, Sell, "1"),
        ];
        executions[0].announced = Some((1, below));
        assert_eq!(
            walk_back(below, &executions),
            Some(vec![(1, top), (2, below)])
        );
    }

    #[test]
    fn placements_the_records_cannot_tell_apart_keep_orders_id_order() {
        // Two buys of 1 around a record of 11: either could be the one
        // before it; the lower `Orders.Id` is taken first.
        let executions = [
            unannounced(1, 7, Buy, "1"),
            announced(1, 8, Buy, "10", 1, "11"),
            unannounced(1, 6, Buy, "1"),
        ];
        assert_eq!(
            walked("12", &executions),
            Some(vec![(6, p("1")), (7, p("12"))])
        );
    }

    #[test]
    fn with_no_agreeing_order_a_millisecond_is_taken_in_orders_id_order_seq_among_records() {
        // No order of these reaches the record 100: the announced ones keep
        // Seq order (Id 4 before Id 2) and the rest go by `Orders.Id`.
        let executions = [
            unannounced(1, 1, Buy, "1"),
            announced(1, 2, Buy, "1", 8, "100"),
            unannounced(1, 3, Buy, "1"),
            announced(1, 4, Buy, "1", 7, "90"),
            unannounced(1, 5, Buy, "1"),
        ];
        // Merged: 1, 3, 4, 2, 5. Back from 10: 5 after 10; the record of
        // Id 2 (100), that of Id 4 (90); 3 after 89, 1 after 88.
        assert_eq!(
            walked("10", &executions),
            Some(vec![(1, p("88")), (3, p("89")), (5, p("10"))])
        );
    }

    /// One millisecond of `n` executions: a record of 1 (a buy of 1, Id
    /// `n`, executed first), then `n - 1` unannounced buys of 1 with lower
    /// ids; now `n`.
    fn crowded(n: i64) -> Vec<Executed> {
        let mut executions: Vec<Executed> = (1..n).map(|id| unannounced(1, id, Buy, "1")).collect();
        executions.push(announced(1, n, Buy, "1", 1, "1"));
        executions
    }

    #[test]
    fn up_to_max_searched_executions_of_a_millisecond_are_placed_by_the_records() {
        let n = MAX_SEARCHED as i64;
        let want: Vec<(i64, Position)> = (1..n).map(|id| (id, Position::from(id + 1))).collect();
        assert_eq!(walked(&n.to_string(), &crowded(n)), Some(want));
    }

    #[test]
    fn beyond_max_searched_a_millisecond_is_taken_in_orders_id_order() {
        // The record still resets the walk: the executions before it in
        // `Orders.Id` order, all before it, walk back from 1 less its buy.
        let n = MAX_SEARCHED as i64 + 1;
        let want: Vec<(i64, Position)> =
            (1..n).map(|id| (id, Position::from(id + 1 - n))).collect();
        assert_eq!(walked(&n.to_string(), &crowded(n)), Some(want));
    }
}
