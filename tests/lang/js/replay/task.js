// The replay test task (same shape in every language): a completed step's body does not
// run again on the next attempt. Expected: succeeds on attempt 2, output {"one":1,"two":2}
// and the milliseconds the attempt had left,
// and the run's logs hold "step one body ran" once.
import { task, step, context, timeLeft, log, RetryableError } from './wasq.js';

export const run = task(async () => {
  const one = await step('one', () => {
    log.info('step one body ran');
    return 1;
  });
  if (context().attempt === 1) throw new RetryableError('fail once');
  const two = await step('two', () => {
    log.info('step two body ran');
    return 2;
  });
  return { one, two, left: timeLeft() };
});
