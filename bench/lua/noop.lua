-- bench/run.sh handler: does nothing and succeeds (the host marks the task done).
return function(task)
  return true
end
